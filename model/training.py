"""Train the model set on what the lake holds: FM, autoencoder, VM, VM+KD and VM+FM-embedding (oracle
coverage), each saved in the registry. The daily DAG, the main job and the evaluations call
``train_all``; the command line that ingests a log first is ``python -m experiments.model_eval``.

``train_all`` returns, and ``write_report`` writes (JSON + Markdown), a table of params, FLOPs per pair, NE, AUC,
calibration, NE relative to the VM and transfer ratio on the time-split test set, and saves every
model in the registry (<lake>/models). The oracle variant feeds every test pair its own compressed
FM embedding (tier ``exact``); serving-realistic coverage comes from the replay evaluation.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from model import data as mdata
from model import metrics, registry
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import Vocab, build_examples, row_inputs, subset
from model.fm import FMConfig, FoundationModel
from model.train import (TrainConfig, ae_loss, bce_loss, fit, flops_per_example, infer, kd_loss, n_params,
                         pick_device, sigmoid)
from model.vm import TIERS, VerticalModel, VMConfig

REFERENCE = {"kd_transfer": "20-25%", "solaris_transfer": "42-44%", "ne_gain": "0.05-0.10%"}


@dataclass(frozen=True)
class ModelSetConfig:
    """Sizes and training settings of every model ``train_all`` trains."""

    history_len: int = 50
    horizon_hours: float = 720.0  # look-back of the FM's history and counters
    fm_dim: int = 64
    fm_layers: int = 2
    fm_trunk: int = 512
    fm_embedding: int = 256
    code_dim: int = 32
    kd_alpha: float = 1.0
    # epochs are upper bounds: each model trains until its validation NE stops improving
    fm_train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=20, lr=1e-3))
    vm_train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=20, lr=3e-3))
    ae_train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, lr=2e-3))
    split: mdata.SplitConfig = field(default_factory=mdata.SplitConfig)
    bootstrap_resamples: int = 1000  # paired bootstrap over test requests for every interval reported


QUICK = ModelSetConfig(history_len=20, fm_dim=32, fm_layers=1, fm_trunk=128, fm_embedding=64, code_dim=16,
                       fm_train=TrainConfig(epochs=20, lr=2e-3), vm_train=TrainConfig(epochs=20, lr=3e-3),
                       ae_train=TrainConfig(epochs=20))


def model_set(sizes: str) -> ModelSetConfig:
    """The model set of a size name: ``quick`` or ``full`` (the ``[models] sizes`` values)."""
    sets = {"quick": QUICK, "full": ModelSetConfig()}
    if sizes not in sets:
        raise ValueError(f"model sizes must be one of {', '.join(sets)}, got {sizes!r}")
    return sets[sizes]


def vm_inputs(x: dict[str, np.ndarray], codes: np.ndarray | None, teacher: np.ndarray | None = None):
    """A VM's inputs from model examples: ids and context, plus the compressed FM embedding served
    as ``exact`` (``codes``) and the soft-label teacher's probability (``teacher``) where given."""
    out = row_inputs(x)
    if codes is not None:
        out["fm"] = codes.astype(np.float32)
        out["tier"] = np.full(len(codes), TIERS.index("exact"), dtype=np.int64)
    if teacher is not None:
        out["teacher"] = teacher.astype(np.float32)
    return out


def train_all(cfg, source: str | None, ec: ModelSetConfig = ModelSetConfig(), log=print, until=None) -> dict:
    """Everything after ingestion: train on what the lake holds, save every model in the registry;
    returns the result table and where things were written. ``until``: train, validate and test on
    the requests before this time only."""
    t0 = time.perf_counter()
    requests, events, items = mdata.load(cfg, source, until)
    result, models, extras = train_frames(requests, events, items, ec, cfg.models.device, log)
    window, rows, root = result["window"] | {"source": source}, result["rows"], cfg.models_root
    saved = {"fm": registry.save(root, "fm", models["FM"], rows[-1], window, extras),
             "autoencoder": registry.save(root, "autoencoder", models["autoencoder"], result["autoencoder"], window),
             "vm": registry.save(root, "vm", models["VM"], rows[0], window, extras),
             "vm_kd": registry.save(root, "vm_kd", models["VM + KD (soft labels)"], rows[1], window, extras),
             "vm_solaris": registry.save(root, "vm_solaris", models["VM + FM embedding (oracle coverage)"],
                                         rows[2], window, extras)}
    return result | {"source": source, "window": window, "models": {k: str(v) for k, v in saved.items()},
                     "seconds": round(time.perf_counter() - t0, 1)}


def train_frames(requests: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame, ec: ModelSetConfig,
                 device_name: str = "auto", log=print) -> tuple[dict, dict, dict[str, str]]:
    """Split ``requests`` by time, train the FM, the autoencoder and the VM variants, and compare
    them on the test split: (result, models by name, registry extras such as the vocabulary)."""
    device = pick_device(device_name)  # the [models] device: auto, cpu or cuda
    fm_train, vm_train, ae_train = (replace(t, device=str(device)) for t in (ec.fm_train, ec.vm_train, ec.ae_train))
    t0 = time.perf_counter()
    splits = mdata.split_by_time(requests, ec.split)
    train_end = splits["train"]["ts"].max()
    vocab = Vocab.fit(splits["train"], events[events["ts"] <= train_end], items)
    x = {k: build_examples(v, events, vocab, ec.history_len, items, ec.horizon_hours) for k, v in splits.items()}
    log(f"  data: {', '.join(f'{k} {len(v):,} rows' for k, v in splits.items())}; "
        f"{len(vocab.values['user']):,} users, {len(vocab.values['item']):,} items in the training vocabulary "
        f"({time.perf_counter() - t0:.0f} s)")
    sizes = dict(n_users=vocab.size("user"), n_items=vocab.size("item"), n_devices=vocab.size("device"),
                 n_surfaces=vocab.size("surface"))
    y = x["test"]["label"]

    log("  training the FM")
    torch.manual_seed(fm_train.seed)  # initial weights too: the same data gives the same models, whatever ran before
    fm = FoundationModel(FMConfig(**sizes, n_categories=vocab.size("category"),
                                  n_subcategories=vocab.size("subcategory"), history_len=ec.history_len,
                                  horizon_hours=ec.horizon_hours, dim=ec.fm_dim, layers=ec.fm_layers,
                                  trunk=ec.fm_trunk, embedding_dim=ec.fm_embedding))
    fit(fm, bce_loss, x["train"], x["val"], fm_train, log)
    fm_p = {k: sigmoid(infer(fm, fm, v, device=device)) for k, v in x.items()}
    emb = {k: infer(fm.embed, fm, v, device=device) for k, v in x.items()}

    log("  training the autoencoder")
    torch.manual_seed(ae_train.seed)
    ae = EmbeddingAutoencoder(AEConfig(input_dim=ec.fm_embedding, code_dim=ec.code_dim))
    ae_data = {k: {"emb": v, "label": np.zeros(len(v), dtype=np.float32)} for k, v in emb.items()}
    fit(ae, ae_loss, ae_data["train"], ae_data["val"], ae_train, log, select="loss")
    codes = {k: infer(lambda b: ae.encode(b["emb"]), ae, v, device=device) for k, v in ae_data.items()}
    recon = infer(lambda b: ae(b["emb"]), ae, ae_data["test"], device=device)
    head_on_recon = sigmoid(infer(lambda b: fm.head(b["emb"]).squeeze(-1), fm,
                                  {"emb": recon, "label": y}, device=device))
    ae_report = {"reconstruction_mse": float(np.mean((recon - emb["test"]) ** 2)),
                 "embedding_variance": float(np.var(emb["test"], axis=0).sum() / emb["test"].shape[1]),
                 "fm_head_ne_original": metrics.normalized_entropy(y, fm_p["test"]),
                 "fm_head_ne_reconstructed": metrics.normalized_entropy(y, head_on_recon)}

    variants = {}
    for name, use_fm, loss, extra in (
            ("VM", False, bce_loss, lambda k: vm_inputs(x[k], None)),
            ("VM + KD (soft labels)", False, kd_loss(ec.kd_alpha), lambda k: vm_inputs(x[k], None, fm_p[k])),
            ("VM + FM embedding (oracle coverage)", True, bce_loss, lambda k: vm_inputs(x[k], codes[k]))):
        log(f"  training {name}")
        torch.manual_seed(vm_train.seed)
        vm = VerticalModel(VMConfig(**sizes, use_fm_embedding=use_fm, fm_dim=ec.code_dim))
        fit(vm, loss, extra("train"), extra("val"), vm_train, log)
        variants[name] = (vm, sigmoid(infer(vm, vm, extra("test"), device=device)), extra("test"))

    rows = []
    ne_fm = metrics.normalized_entropy(y, fm_p["test"])
    ne_vm = metrics.normalized_entropy(y, variants["VM"][1])
    sample = subset(x["test"], np.arange(min(256, len(y))))
    for name, (vm, p, xt) in variants.items():
        s = metrics.summary(y, p)
        rows.append({"model": name, "params": n_params(vm),
                     "flops_per_pair": flops_per_example(vm, vm, {k: v[:256] for k, v in xt.items()}), **s,
                     "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm,
                     "transfer_ratio": metrics.transfer_ratio(ne_vm, s["ne"], ne_fm)})
    s = metrics.summary(y, fm_p["test"])
    rows.append({"model": "FM", "params": n_params(fm), "flops_per_pair": flops_per_example(fm, fm, sample), **s,
                 "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm, "transfer_ratio": 1.0 if ne_fm < ne_vm else float("nan")})
    intervals = metrics.paired_bootstrap(
        y, {**{name: p for name, (_, p, _) in variants.items()}, "FM": fm_p["test"]},
        splits["test"]["request_id"].to_numpy(), baseline="VM", reference="FM",
        resamples=ec.bootstrap_resamples, seed=ec.split.seed)
    for r in rows:
        ci = intervals[r["model"]]
        r.update(ne_ci=ci["ne"], auc_ci=ci["auc"], ne_vs_vm_pct_ci=ci["ne_delta_pct_ci"], auc_vs_vm=ci["auc_delta"],
                 auc_vs_vm_ci=ci["auc_delta_ci"], transfer_ratio_ci=ci["transfer_ratio_ci"])

    test = splits["test"]
    predictions = pd.DataFrame({"request_id": test["request_id"].to_numpy(), "item_id": test["item_id"].to_numpy(),
                                "label": y, **{name: p for name, (_, p, _) in variants.items()}, "FM": fm_p["test"]})
    result = {"rows": rows, "predictions": predictions, "autoencoder": ae_report, "bootstrap": intervals["_meta"],
              "fm_beats_vm": intervals["_meta"]["reference_beats_baseline"], "window": mdata.window(splits, None),
              "device": str(device), "fm_vm_flops_ratio": rows[-1]["flops_per_pair"] / rows[0]["flops_per_pair"],
              "embedding_dims": [ec.fm_embedding, ec.code_dim], "seconds": round(time.perf_counter() - t0, 1),
              "reference": REFERENCE}
    models = {"FM": fm, "autoencoder": ae, **{name: m for name, (m, _, _) in variants.items()}}
    return result, models, {"vocab.json": json.dumps(vocab.values)}


def to_markdown(result: dict) -> str:
    lines = [f"### {result['source']}: time-split test set ({result['window']['test']['rows']:,} rows, "
             f"CTR {result['window']['test']['ctr']:.3f})", "",
             "| model | params | FLOPs/pair | NE [95% CI] | AUC [95% CI] | calibration | NE vs VM [95% CI] | "
             "AUC vs VM [95% CI] | transfer ratio [95% CI] |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fm_better, ci = result["fm_beats_vm"], metrics.format_interval
    for r in result["rows"]:
        tr = "" if r["model"] in ("VM", "FM") else metrics.transfer_label(r["transfer_ratio"], r["transfer_ratio_ci"], fm_better)
        lines.append(f"| {r['model']} | {r['params']:,} | {r['flops_per_pair']:,.0f} | {r['ne']:.4f} {ci(r['ne_ci'], '.4f')} | "
                     f"{r['auc']:.4f} {ci(r['auc_ci'], '.4f')} | {r['calibration']:.3f} | "
                     f"{r['ne_vs_vm_pct']:+.2f}% {ci(r['ne_vs_vm_pct_ci'], '+.2f')} | "
                     f"{r['auc_vs_vm']:+.4f} {ci(r['auc_vs_vm_ci'], '+.4f')} | {tr} |")
    b = result["bootstrap"]
    verdict = ("the FM beats the VM: the interval of its NE delta lies below zero" if fm_better else
               "the FM does not beat the VM with an interval that excludes zero, so no transfer ratio is shown")
    lines += ["", f"Intervals: paired bootstrap over the {b['groups']:,} test requests, {b['resamples']:,} resamples; {verdict}."]
    a = result["autoencoder"]
    lines += ["", f"FM/VM FLOPs per pair: {result['fm_vm_flops_ratio']:,.0f}x. Autoencoder "
              f"({result['embedding_dims'][0]} -> {result['embedding_dims'][1]} floats): reconstruction MSE {a['reconstruction_mse']:.4g} "
              f"(per-dimension embedding variance {a['embedding_variance']:.4g}); FM head NE on the original "
              f"embedding {a['fm_head_ne_original']:.4f}, on the reconstruction {a['fm_head_ne_reconstructed']:.4f}.",
              f"Paper reference: KD transfers {REFERENCE['kd_transfer']}, SOLARIS {REFERENCE['solaris_transfer']}.",
              f"Trained on {result['device']} in {result['seconds']} s."]
    return "\n".join(lines)


def write_report(result: dict, out: Path, markdown: str | None = None) -> tuple[Path, Path]:
    """The result as JSON (without the per-row predictions) and Markdown (``markdown``, else
    ``to_markdown(result)``) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"model_eval_{result['source'] or 'all'}"
    js, md = stem.with_suffix(".json"), stem.with_suffix(".md")
    js.write_text(json.dumps({k: v for k, v in result.items() if k != "predictions"}, indent=1, default=float))
    md.write_text((markdown or to_markdown(result)) + "\n")
    return js, md
