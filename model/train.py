"""Training and batched inference for every SOLARIS model, on the configured device.

Inference runs under ``eval()`` and ``torch.inference_mode()``, in batches, and refuses NaN or
infinite inputs rather than passing them on.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

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
    epochs: int = 4
    batch_size: int = 1024
    lr: float = 2e-3
    weight_decay: float = 1e-6
    patience: int = 1  # epochs without validation improvement before stopping
    seed: int = 7
    device: str = "auto"


def batches(arrays: dict[str, np.ndarray], batch_size: int, device: torch.device, shuffle: bool = False,
            seed: int = 0):
    n = len(next(iter(arrays.values())))
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    for s in range(0, n, batch_size):
        idx = order[s:s + batch_size]
        yield {k: torch.as_tensor(v[idx]).to(device) for k, v in arrays.items()}


def check_finite(arrays: dict[str, np.ndarray]) -> None:
    for k, v in arrays.items():
        if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all():
            raise ValueError(f"input {k!r} has {int((~np.isfinite(v)).sum())} NaN or infinite values")


def fit(model: nn.Module, loss_fn: Callable[[nn.Module, Batch], torch.Tensor], train: dict[str, np.ndarray],
        val: dict[str, np.ndarray], cfg: TrainConfig, log: Callable[[str], None] = print) -> dict:
    """Adam with early stopping on validation loss; the best epoch's weights are kept."""
    check_finite(train)
    check_finite(val)
    if len(train["label"]) == 0:
        raise ValueError("empty training window: no examples to train on")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    best, best_state, bad_epochs, history = math.inf, None, 0, []
    for epoch in range(cfg.epochs):
        model.train()
        total, n = 0.0, 0
        for b in batches(train, cfg.batch_size, device, shuffle=True, seed=cfg.seed + epoch):
            loss = loss_fn(model, b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b["label"])
            n += len(b["label"])
        val_loss = evaluate_loss(model, loss_fn, val, cfg.batch_size, device)
        history.append({"epoch": epoch, "train_loss": total / n, "val_loss": val_loss})
        log(f"    epoch {epoch}: train {total / n:.5f}  val {val_loss:.5f}")
        if val_loss < best - 1e-6:
            best, best_state, bad_epochs = val_loss, copy.deepcopy(model.state_dict()), 0
        else:
            bad_epochs += 1
            if bad_epochs > cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return {"best_val_loss": best, "epochs": history}


def evaluate_loss(model, loss_fn, arrays, batch_size, device) -> float:
    model.eval()
    total, n = 0.0, 0
    with torch.inference_mode():
        for b in batches(arrays, batch_size, device):
            total += loss_fn(model, b).item() * len(b["label"])
            n += len(b["label"])
    return total / max(n, 1)


def infer(fn: Callable[[Batch], torch.Tensor], model: nn.Module, arrays: dict[str, np.ndarray],
          batch_size: int = 4096, device: torch.device | str = "cpu") -> np.ndarray:
    """Batched inference of ``fn(batch)`` (e.g. model, model.embed), returned as float32 numpy."""
    check_finite(arrays)
    device = torch.device(device)
    model.to(device).eval()
    out = []
    with torch.inference_mode():
        for b in batches(arrays, batch_size, device):
            out.append(fn(b).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0,), dtype=np.float32)


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
    """Forward FLOPs per example, counted by torch's FlopCounterMode on a real batch."""
    from torch.utils.flop_counter import FlopCounterMode

    model.to("cpu").eval()
    b = {k: torch.as_tensor(v) for k, v in sample.items()}
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(b)
    return counter.get_total_flops() / len(sample["label"])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
