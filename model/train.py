"""Training and batched inference for every SOLARIS model, on the configured device.

Inference runs under ``eval()`` and ``torch.inference_mode()``, in batches, and refuses NaN or
infinite inputs rather than passing them on.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from model.features import REQUEST_KEYS

Batch = dict[str, torch.Tensor]


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when present, else CPU. ``cuda`` without a GPU is an error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    return torch.device(name)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 30  # at most: training stops when validation asks (patience)
    batch_size: int = 1024  # rows (candidates) per step
    lr: float = 2e-3
    weight_decay: float = 1e-6
    patience: int = 2  # epochs without validation improvement before stopping
    warmup_steps: int = 200  # linear learning-rate warm-up at the start
    lr_decay: float = 0.5  # the learning rate is multiplied by this after an epoch without improvement
    seed: int = 7
    device: str = "auto"


def _request_layout(arrays: dict[str, np.ndarray]):
    """For grouped arrays (a history row per request, ``req`` per candidate row): the rows of each
    request as (order, starts, counts) over ``req``; None for plain row arrays."""
    if "req" not in arrays or not any(k in arrays for k in REQUEST_KEYS):
        return None
    req = arrays["req"]
    n_req = len(next(arrays[k] for k in REQUEST_KEYS if k in arrays))
    order = np.argsort(req, kind="stable")
    counts = np.bincount(req, minlength=n_req)
    return order, np.cumsum(counts) - counts, counts


def batches(arrays: dict[str, np.ndarray], batch_size: int, device: torch.device, shuffle: bool = False,
            seed: int = 0):
    """Yield (rows, batch): ``rows`` the indices of the batch's rows in ``arrays``. Grouped arrays
    are batched by whole requests (about ``batch_size`` rows), their history rows with them."""
    n = len(arrays["label"]) if "label" in arrays else len(next(v for k, v in arrays.items() if k not in REQUEST_KEYS))
    rng = np.random.default_rng(seed)
    layout = _request_layout(arrays)
    if layout is None:
        order = rng.permutation(n) if shuffle else np.arange(n)
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            yield idx, {k: torch.as_tensor(v[idx]).to(device) for k, v in arrays.items()}
        return
    row_order, starts, counts = layout
    n_req = len(counts)
    per_batch = max(1, int(round(batch_size / max(n / max(n_req, 1), 1.0))))
    req_order = rng.permutation(n_req) if shuffle else np.arange(n_req)
    for s in range(0, n_req, per_batch):
        reqs = req_order[s:s + per_batch]
        c = counts[reqs]
        # the rows of the chosen requests: each request's run of row_order, concatenated
        offsets = np.repeat(starts[reqs] - (np.cumsum(c) - c), c) + np.arange(c.sum())
        rows = row_order[offsets]
        b = {k: torch.as_tensor(v[reqs] if k in REQUEST_KEYS else v[rows]).to(device)
             for k, v in arrays.items() if k != "req"}
        b["req"] = torch.as_tensor(np.repeat(np.arange(len(reqs)), c)).to(device)
        yield rows, b


def check_finite(arrays: dict[str, np.ndarray]) -> None:
    for k, v in arrays.items():
        if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all():
            raise ValueError(f"input {k!r} has {int((~np.isfinite(v)).sum())} NaN or infinite values")


def fit(model: nn.Module, loss_fn: Callable[[nn.Module, Batch], torch.Tensor], train: dict[str, np.ndarray],
        val: dict[str, np.ndarray], cfg: TrainConfig, log: Callable[[str], None] = print,
        select: str = "ne") -> dict:
    """Adam with a linear warm-up, the learning rate cut after every epoch without validation
    improvement, and early stopping after ``patience`` such epochs; the best epoch's weights are
    kept. ``select``: what validation improves, ``ne`` (the NE of the model's click
    probability against ``label``, whatever the training loss) or ``loss`` (the training loss).
    ``log`` gets one line per epoch with SOLARIS_VERBOSE=1 (``--verbose``), else one at the end."""
    every_epoch = os.environ.get("SOLARIS_VERBOSE", "") not in ("", "0")
    check_finite(train)
    check_finite(val)
    if len(train["label"]) == 0:
        raise ValueError("empty training window: no examples to train on")
    if select not in ("ne", "loss"):
        raise ValueError(f"select must be ne or loss, got {select!r}")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    lr, step = cfg.lr, 0
    best, best_state, bad_epochs, history = math.inf, None, 0, []
    for epoch in range(cfg.epochs):
        model.train()
        total, n = 0.0, 0
        for _, b in batches(train, cfg.batch_size, device, shuffle=True, seed=cfg.seed + epoch):
            step += 1
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, step / max(cfg.warmup_steps, 1))
            loss = loss_fn(model, b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b["label"])
            n += len(b["label"])
        score = validation_ne(model, val, cfg.batch_size, device) if select == "ne" \
            else evaluate_loss(model, loss_fn, val, cfg.batch_size, device)
        history.append({"epoch": epoch, "train_loss": total / n, f"val_{select}": score, "lr": lr})
        if every_epoch:
            log(f"    epoch {epoch}: train loss {total / n:.5f}  val {select} {score:.5f}  lr {lr:.2g}")
        if score < best - 1e-6:
            best, best_state, bad_epochs = score, copy.deepcopy(model.state_dict()), 0
        else:
            bad_epochs += 1
            lr *= cfg.lr_decay
            if bad_epochs >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    if not every_epoch and history:
        at = min(history, key=lambda h: h[f"val_{select}"])
        log(f"    {len(history)} epochs, best val {select} {at[f'val_{select}']:.5f} at epoch {at['epoch']} "
            f"(train loss {at['train_loss']:.5f}); every epoch with --verbose")
    return {f"best_val_{select}": best, "epochs": history}


def validation_ne(model, arrays, batch_size, device) -> float:
    """NE of the model's click probability on ``arrays`` (log loss over the entropy of their CTR)."""
    p = sigmoid(infer(model, model, arrays, batch_size, device))
    y = arrays["label"].astype(np.float64)
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    ctr = float(np.clip(y.mean(), 1e-7, 1 - 1e-7))
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)) / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr)))


def evaluate_loss(model, loss_fn, arrays, batch_size, device) -> float:
    model.eval()
    total, n = 0.0, 0
    with torch.inference_mode():
        for _, b in batches(arrays, batch_size, device):
            total += loss_fn(model, b).item() * len(b["label"])
            n += len(b["label"])
    return total / max(n, 1)


def infer(fn: Callable[[Batch], torch.Tensor], model: nn.Module, arrays: dict[str, np.ndarray],
          batch_size: int = 4096, device: torch.device | str = "cpu") -> np.ndarray:
    """Batched inference of ``fn(batch)`` (e.g. model, model.embed), returned as float32 numpy."""
    check_finite(arrays)
    device = torch.device(device)
    model.to(device).eval()
    out, where = [], []
    with torch.inference_mode():
        for rows, b in batches(arrays, batch_size, device):
            out.append(fn(b).float().cpu().numpy())
            where.append(rows)
    if not out:
        return np.zeros((0,), dtype=np.float32)
    got = np.concatenate(out)
    result = np.empty_like(got)
    result[np.concatenate(where)] = got  # back in the order of ``arrays``
    return result


def bce_loss(model, b: Batch) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(model(b), b["label"])


def kd_loss(alpha: float) -> Callable[[nn.Module, Batch], torch.Tensor]:
    """Soft-label distillation: label BCE + alpha * BCE against the FM's predicted probability."""
    def loss(model, b: Batch) -> torch.Tensor:
        logits = model(b)
        hard = nn.functional.binary_cross_entropy_with_logits(logits, b["label"])
        soft = nn.functional.binary_cross_entropy_with_logits(logits, b["teacher"])
        return hard + alpha * soft
    return loss


def ae_loss(model, b: Batch) -> torch.Tensor:
    return nn.functional.mse_loss(model(b["emb"]), b["emb"])


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def flops_per_example(fn: Callable[[Batch], torch.Tensor], model: nn.Module, sample: dict[str, np.ndarray]) -> float:
    """Forward FLOPs per example, counted by torch's FlopCounterMode on a real batch. Counted with
    autograd on: under inference mode the transformer layers take a fused fast path whose FLOPs
    the counter does not see."""
    from torch.utils.flop_counter import FlopCounterMode

    model.to("cpu").eval()
    _, b = next(batches(sample, len(sample["label"]), torch.device("cpu")))
    with FlopCounterMode(display=False) as counter:
        fn(b)
    return counter.get_total_flops() / len(b["label"])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
