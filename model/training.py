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
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from model import baselines, interface, metrics, registry
from model import data as mdata
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import Vocab, build_examples, model_inputs, row_inputs, subset
from model.fm import FoundationModel
from model.train import (TrainConfig, ae_loss, bce_loss, fit, flops_per_example, infer, kd_loss, n_params,
                         pick_device, sigmoid)
from model.vm import TIERS, TRAINED, VerticalModel

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


# tiny: seconds on two cores, to run a deployment's DAGs end to end (the test suite's model set); no
# figure it gives means anything
TINY = replace(QUICK, history_len=5, fm_dim=8, fm_trunk=32, fm_embedding=16, code_dim=4,
               fm_train=TrainConfig(epochs=1, batch_size=256), vm_train=TrainConfig(epochs=1, batch_size=256),
               ae_train=TrainConfig(epochs=1, batch_size=256))


def model_set(sizes: str) -> ModelSetConfig:
    """The model set of a size name: ``quick``, ``full`` or ``tiny`` (the ``[models] sizes`` values)."""
    sets = {"quick": QUICK, "full": ModelSetConfig(), "tiny": TINY}
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


@dataclass(frozen=True)
class Consumer:
    """A VM that reads the served embeddings: its task's label, its surface filter, its class."""

    name: str = "click"
    task: str = "click"  # click: the ``label`` column; conversion: the ``conversion`` column
    surface: str = ""  # "" every surface
    vm_class: type = VerticalModel
    params: dict = field(default_factory=dict)


def label_column(task: str) -> str:
    """The request_log column a task learns: ``label`` for clicks, the task's own column otherwise."""
    return "label" if task == "click" else task


@dataclass(frozen=True)
class ModelChoice:
    """Which FM class trains (on clicks) and which consumer VMs read its embedding."""

    fm_class: type = FoundationModel
    fm_params: dict = field(default_factory=dict)
    consumers: tuple[Consumer, ...] = (Consumer(),)
    primary: str = "click"  # the consumer whose table is the result's top level (the verifier)

    @classmethod
    def from_config(cls, cfg) -> "ModelChoice":
        """The ``[models]`` section's classes (only those it allows) and consumers, every parameter
        checked against its class before anything trains. ``vm_params`` go to the consumers of
        ``vm_class``; a consumer with a class of its own takes its ``params`` only."""
        m, allowed = cfg.models, cfg.allowed_classes
        fm = interface.check_params(interface.fm_class(m.fm_class, allowed), m.fm_params)
        consumers = []
        for c in m.consumers:
            params = (dict(c.params) if c.class_path else {**m.vm_params, **c.params}) \
                | ({"features": tuple(c.features)} if c.features else {})
            vm = interface.vm_class(c.class_path or m.vm_class, allowed)
            try:
                interface.check_params(vm, params)
            except interface.ModelInterfaceError as e:
                raise interface.ModelInterfaceError(f"consumer {c.name!r}: {e}") from None
            consumers.append(Consumer(c.name, c.task, c.surface, vm, params))
        return cls(fm_class=fm, fm_params=dict(m.fm_params), consumers=tuple(consumers), primary=m.verifier)

    @property
    def tasks(self) -> set[str]:
        return {c.task for c in self.consumers}


def train_all(cfg, source: str | None, ec: ModelSetConfig = ModelSetConfig(), log=print, until=None) -> dict:
    """Everything after ingestion: train on what the lake holds, save every model in the registry;
    returns the result table and where things were written. ``until``: train, validate and test on
    the requests before this time only. The FM and the consumers are the config's (``[models]``)."""
    t0 = time.perf_counter()
    choice = ModelChoice.from_config(cfg)
    leaks = mdata.require_leak_free(cfg, source)
    if leaks:
        log(f"WARNING: training on leaking candidates ({len(leaks)} finding(s), e.g. {leaks[0]}): every figure is marked")
    requests, events, items = mdata.load(cfg, source, until, extra_labels=sorted(choice.tasks - {"click"}))
    result, models, extras = train_frames(requests, events, items, ec, cfg.models.device, log, choice)
    window, root = result["window"] | {"source": source}, cfg.models_root
    saved = {"fm": registry.save(root, "fm", models["FM"], result["fm_metrics"], window, extras),
             "autoencoder": registry.save(root, "autoencoder", models["autoencoder"], result["autoencoder"], window)}
    for name, table in result["consumers"].items():
        rows = {r["model"]: r for r in table["rows"]}
        cwindow = table["window"] | {"source": source, "consumer": table["consumer"]}
        # the oracle is a reference (the ceiling of full coverage), not the consumer that serves:
        # vm_<name>_solaris is trained on what the lookup served (model/served_training.py)
        for variant, model_name in (("", "VM"), ("kd", KD), ("oracle", ORACLE)):
            if model_name in rows:
                key = registry.consumer_name(name, variant)
                vocab = {"vocab.json": json.dumps(models[(name, "vocab")].values)}  # the consumer's own ids
                saved[key] = registry.save(root, key, models[(name, model_name)], rows[model_name], cwindow, vocab)
    if leaks:
        for table in result["consumers"].values():
            table["leaking_candidates"] = leaks
    return result | {"source": source, "window": window, "models": {k: str(v) for k, v in saved.items()},
                     "seconds": round(time.perf_counter() - t0, 1), "leaking_candidates": leaks}


KD, ORACLE = "VM + KD (soft labels)", "VM + FM embedding (oracle coverage)"


def train_frames(requests: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame, ec: ModelSetConfig,
                 device_name: str = "auto", log=print, choice: ModelChoice = ModelChoice()
                 ) -> tuple[dict, dict, dict[str, str]]:
    """Split ``requests`` by time, train the FM (on ``label``, the clicks) and the autoencoder, then
    every consumer's VM variants on its own rows of the same split, and compare them on its test
    rows: (result, models by name (consumer VMs by (consumer, variant)), registry extras such as
    the vocabulary). The result's top level is the primary consumer's table; ``consumers`` holds all."""
    device = pick_device(device_name)  # the [models] device: auto, cpu or cuda
    fm_train, vm_train, ae_train = (replace(t, device=str(device)) for t in (ec.fm_train, ec.vm_train, ec.ae_train))
    t0 = time.perf_counter()
    splits = mdata.split_by_time(requests, ec.split)
    train_end = splits["train"]["ts"].max()
    vocab = Vocab.fit(splits["train"], events[events["ts"] <= train_end], items)
    sizes = dict(n_users=vocab.size("user"), n_items=vocab.size("item"), n_devices=vocab.size("device"),
                 n_surfaces=vocab.size("surface"))
    torch.manual_seed(fm_train.seed)  # initial weights too: the same data gives the same models, whatever ran before
    fm = interface.build(choice.fm_class, {**sizes, "n_categories": vocab.size("category"),
                                           "n_subcategories": vocab.size("subcategory"), "history_len": ec.history_len,
                                           "horizon_hours": ec.horizon_hours, "dim": ec.fm_dim, "layers": ec.fm_layers,
                                           "trunk": ec.fm_trunk, "embedding_dim": ec.fm_embedding}, choice.fm_params)
    x = {k: build_examples(v, events, vocab, fm.cfg.history_len, items, fm.cfg.horizon_hours) for k, v in splits.items()}
    log(f"  data: {', '.join(f'{k} {len(v):,} rows' for k, v in splits.items())}; "
        f"{len(vocab.values['user']):,} users, {len(vocab.values['item']):,} items in the training vocabulary "
        f"({time.perf_counter() - t0:.0f} s)")
    fm_x = {k: model_inputs(v, fm.inputs) for k, v in x.items()}
    y = x["test"]["label"]

    log(f"  training the FM ({interface.class_path(type(fm))})")
    fit(fm, bce_loss, fm_x["train"], fm_x["val"], fm_train, log)
    fm_p = {k: sigmoid(infer(fm, fm, v, device=device)) for k, v in fm_x.items()}
    emb = {k: infer(fm.embed, fm, v, device=device) for k, v in fm_x.items()}
    embedding_dim = emb["train"].shape[1]

    log("  training the autoencoder")
    torch.manual_seed(ae_train.seed)
    ae = EmbeddingAutoencoder(AEConfig(input_dim=embedding_dim, code_dim=ec.code_dim))
    ae_data = {k: {"emb": v, "label": np.zeros(len(v), dtype=np.float32)} for k, v in emb.items()}
    fit(ae, ae_loss, ae_data["train"], ae_data["val"], ae_train, log, select="loss")
    codes = {k: infer(lambda b: ae.encode(b["emb"]), ae, v, device=device) for k, v in ae_data.items()}
    recon = infer(lambda b: ae(b["emb"]), ae, ae_data["test"], device=device)
    ae_report = {"reconstruction_mse": float(np.mean((recon - emb["test"]) ** 2)),
                 "embedding_variance": float(np.var(emb["test"], axis=0).sum() / emb["test"].shape[1]),
                 "fm_head_ne_original": metrics.normalized_entropy(y, fm_p["test"])}
    if callable(getattr(fm, "head", None)):  # an FM whose click logit is a head over its embedding
        head_on_recon = sigmoid(infer(lambda b: fm.head(b["emb"]).squeeze(-1), fm, {"emb": recon, "label": y}, device=device))
        ae_report["fm_head_ne_reconstructed"] = metrics.normalized_entropy(y, head_on_recon)
    fm_metrics = metrics.summary(y, fm_p["test"]) | {"class": interface.class_path(type(fm))}
    sample = subset(fm_x["test"], np.arange(min(256, len(y))))
    fm_flops = flops_per_example(fm, fm, sample)

    models: dict = {"FM": fm, "autoencoder": ae}
    tables = {}
    for c in choice.consumers:
        rows = {k: consumer_rows(v, c) for k, v in splits.items()}
        tables[c.name] = train_consumer(c, splits, rows, x, codes, fm_p, sizes, ec, vm_train, device, fm,
                                        fm_flops, models, log)
    if choice.primary not in tables:
        raise ValueError(f"primary consumer {choice.primary!r} is not among {list(tables)}")
    result = {**tables[choice.primary], "consumers": tables, "autoencoder": ae_report, "fm_metrics": fm_metrics,
              "window": mdata.window(splits, None), "device": str(device), "embedding_dims": [embedding_dim, ec.code_dim],
              "fm_class": interface.class_path(type(fm)), "seconds": round(time.perf_counter() - t0, 1),
              "reference": REFERENCE}
    return result, models, {"vocab.json": json.dumps(vocab.values)}


def vm_sizes(vocab: Vocab) -> dict[str, int]:
    """A VM's vocabulary sizes, as its config names them."""
    return dict(n_users=vocab.size("user"), n_items=vocab.size("item"), n_devices=vocab.size("device"),
                n_surfaces=vocab.size("surface"))


def vm_ids(vocab: Vocab, rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The ids and context codes a VM reads, through its own vocabulary."""
    return {"user": vocab.encode("user", rows["user_id"]), "item": vocab.encode("item", rows["item_id"]),
            "device": vocab.encode("device", rows["device"]), "surface": vocab.encode("surface", rows["surface"])}


def consumer_rows(split: pd.DataFrame, c) -> np.ndarray:
    """Positions of the rows of ``split`` that consumer ``c`` (a ``Consumer`` or its config: name,
    task, surface) reads: its surface's, with its task's label known."""
    column = label_column(c.task)
    if column not in split:
        raise ValueError(f"consumer {c.name!r} learns {c.task!r}, but the log has no {column!r} column")
    keep = split[column].notna()
    if c.surface:
        keep &= split["surface"].astype(str) == c.surface
    return np.flatnonzero(keep.to_numpy())


def train_baselines(c: Consumer, mine, labels, vx, sizes, vm_train: TrainConfig, device, models: dict,
                    log) -> dict[str, np.ndarray]:
    """Test predictions of the baselines (model.baselines) on the consumer's rows of the split; the
    matrix factorisation goes to ``models`` as (consumer, name)."""
    out = {baselines.POPULARITY: baselines.item_rate(mine["train"]["item_id"], labels["train"], mine["test"]["item_id"])}
    log(f"  training {c.name}: {baselines.MF}")
    torch.manual_seed(vm_train.seed)
    mf = baselines.MatrixFactorization(baselines.MFConfig(n_users=sizes["n_users"], n_items=sizes["n_items"]))
    ids = lambda k: {n: v for n, v in vx[k].items() if n in ("user", "item", "position", "label")}  # noqa: E731
    fit(mf, bce_loss, ids("train"), ids("val"), vm_train, log)
    out[baselines.MF] = sigmoid(infer(mf, mf, ids("test"), device=device))
    models[(c.name, baselines.MF)] = mf
    return out


def train_consumer(c: Consumer, splits, rows, x, codes, fm_p, sizes, ec: ModelSetConfig, vm_train: TrainConfig,
                   device, fm, fm_flops: float, models: dict, log) -> dict:
    """One consumer's VM, VM + KD (when the FM predicts its task) and VM + FM embedding (oracle),
    trained on its rows of the split and compared on its test rows, with paired-bootstrap intervals.
    The FM's own row (and with it transfer ratios) exists for the FM's task only."""
    for k, r in rows.items():
        if len(r) == 0:
            raise ValueError(f"consumer {c.name!r} ({c.task}{', surface ' + c.surface if c.surface else ''}) has no "
                             f"rows in the {k} split: check its surface and that the log has its label")
    mine = {k: splits[k].iloc[r].assign(label=splits[k][label_column(c.task)].to_numpy(dtype=np.float32)[r])
            for k, r in rows.items()}  # the consumer's rows of each split, labelled with its task
    labels = {k: v["label"].to_numpy() for k, v in mine.items()}
    # The VM's ids are those of its own training rows: every row it has is trained (model.vm)
    vocab = Vocab.of_rows(mine["train"])
    sizes = sizes | vm_sizes(vocab)
    vx = {k: {**row_inputs(subset(x[k], r)), **vm_ids(vocab, mine[k]), "label": labels[k]} for k, r in rows.items()}
    models[(c.name, "vocab")] = vocab
    same_task = c.task == "click"  # the FM learned clicks: its probability is a teacher for clicks only
    variants = [("VM", False, bce_loss, lambda k: vm_inputs(vx[k], None)),
                *([(KD, False, kd_loss(ec.kd_alpha), lambda k: vm_inputs(vx[k], None, fm_p[k][rows[k]]))] if same_task else []),
                (ORACLE, True, bce_loss, lambda k: vm_inputs(vx[k], codes[k][rows[k]]))]
    preds, out_rows = {}, []
    for name, use_fm, loss, inputs in variants:
        log(f"  training {c.name}: {name}")
        torch.manual_seed(vm_train.seed)
        vm = interface.build(c.vm_class, {**sizes, **TRAINED, "use_fm_embedding": use_fm, "fm_dim": ec.code_dim},
                             c.params)
        fit(vm, loss, inputs("train"), inputs("val"), vm_train, log)
        xt = inputs("test")
        preds[name] = sigmoid(infer(vm, vm, xt, device=device))
        models[(c.name, name)] = vm
        out_rows.append({"model": name, "params": n_params(vm),
                         "flops_per_pair": flops_per_example(vm, vm, {k: v[:256] for k, v in xt.items()})})
    preds.update(train_baselines(c, mine, labels, vx, sizes, vm_train, device, models, log))
    y = labels["test"]
    if same_task:
        preds["FM"] = fm_p["test"][rows["test"]]
        out_rows.append({"model": "FM", "params": n_params(fm), "flops_per_pair": fm_flops})
    ne_vm = metrics.normalized_entropy(y, preds["VM"])
    ne_fm = metrics.normalized_entropy(y, preds["FM"]) if same_task else float("nan")
    test = mine["test"]
    intervals = metrics.paired_bootstrap(y, preds, test["request_id"].to_numpy(), baseline="VM",
                                         reference="FM" if same_task else None,
                                         resamples=ec.bootstrap_resamples, seed=ec.split.seed)
    out_rows += [{"model": name, "params": None if name == baselines.POPULARITY else n_params(models[(c.name, name)]),
                  "flops_per_pair": None} for name in baselines.NAMES]
    for r in out_rows:
        s = metrics.summary(y, preds[r["model"]])
        ci = intervals[r["model"]]
        r.update(**s, ne_vs_vm_pct=100 * (s["ne"] - ne_vm) / ne_vm,
                 transfer_ratio=(1.0 if ne_fm < ne_vm else float("nan")) if r["model"] == "FM"
                 else metrics.transfer_ratio(ne_vm, s["ne"], ne_fm),
                 ne_ci=ci["ne"], auc_ci=ci["auc"], ne_vs_vm_pct_ci=ci["ne_delta_pct_ci"], auc_vs_vm=ci["auc_delta"],
                 auc_vs_vm_ci=ci["auc_delta_ci"], transfer_ratio_ci=ci.get("transfer_ratio_ci"))
    predictions = pd.DataFrame({"request_id": test["request_id"].to_numpy(), "item_id": test["item_id"].to_numpy(),
                                "label": y, **preds})
    return {"consumer": {"name": c.name, "task": c.task, "surface": c.surface,
                         "class": interface.class_path(c.vm_class)},
            "rows": [r for r in out_rows if r["model"] not in baselines.NAMES],
            "baselines": [r for r in out_rows if r["model"] in baselines.NAMES],
            "predictions": predictions, "bootstrap": intervals["_meta"],
            "fm_beats_vm": intervals["_meta"]["reference_beats_baseline"] if same_task else None,
            # torch's counter sees matmuls and convolutions: a VM of lookups and products alone counts 0
            "fm_vm_flops_ratio": fm_flops / out_rows[0]["flops_per_pair"] if out_rows[0]["flops_per_pair"] else float("nan"),
            "window": mdata.window(mine, None)}


def consumer_markdown(table: dict, ci=metrics.format_interval) -> list[str]:
    """One consumer's table: every variant with its intervals; transfer ratios only where the FM
    predicts the consumer's task and beats its VM with an interval excluding zero."""
    c, w = table["consumer"], table["window"]["test"]
    rate = "CTR" if c["task"] == "click" else f"{c['task']} rate"
    lines = [f"#### consumer `{c['name']}`: {c['task']}{', surface ' + c['surface'] if c['surface'] else ''} "
             f"({c['class']}; {w['rows']:,} test rows, {rate} {w['ctr']:.4f})", "",
             "| model | params | FLOPs/pair | NE [95% CI] | AUC [95% CI] | calibration | NE vs VM [95% CI] | "
             "AUC vs VM [95% CI] | transfer ratio [95% CI] |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fm_better, leaking = table["fm_beats_vm"], table.get("leaking_candidates")
    if leaking:
        lines[:0] = [leaking_mark(leaking), ""]
    for r in table["rows"] + table.get("baselines", []):
        tr = ("" if r["model"] in ("VM", "FM", *baselines.NAMES) else "n/a: the FM does not predict this task"
              if fm_better is None else metrics.transfer_label(r["transfer_ratio"], r["transfer_ratio_ci"], fm_better,
                                                               bool(leaking)))
        params = f"{r['params']:,}" if r["params"] is not None else "-"
        flops = f"{r['flops_per_pair']:,.0f}" if r["flops_per_pair"] is not None else "-"
        lines.append(f"| {r['model']}{LEAKING if leaking else ''} | {params} | {flops} | {r['ne']:.4f} {ci(r['ne_ci'], '.4f')} | "
                     f"{r['auc']:.4f} {ci(r['auc_ci'], '.4f')} | {r['calibration']:.3f} | "
                     f"{r['ne_vs_vm_pct']:+.2f}% {ci(r['ne_vs_vm_pct_ci'], '+.2f')} | "
                     f"{r['auc_vs_vm']:+.4f} {ci(r['auc_vs_vm_ci'], '+.4f')} | {tr} |")
    b, ratio = table["bootstrap"], table["fm_vm_flops_ratio"]
    flops = f"{ratio:,.0f}x" if math.isfinite(ratio) else "n/a (the counter sees no matmul in the VM)"
    verdict = ("the FM was trained on clicks: it has no prediction (and KD no teacher) for this task, so NE deltas "
               "against the VM are the result" if fm_better is None else
               "the FM beats the VM: the interval of its NE delta lies below zero" if fm_better else
               "the FM does not beat the VM with an interval that excludes zero, so no transfer ratio is shown")
    return lines + ["", f"Intervals: paired bootstrap over the {b['groups']:,} test requests, {b['resamples']:,} "
                        f"resamples; {verdict}. FM/VM FLOPs per pair: {flops}."]


LEAKING = " (leaking candidates)"


def leaking_mark(leaks: list[str]) -> str:
    """The line every report puts above figures trained and tested on leaking candidates."""
    return (f"**LEAKING CANDIDATES: every figure below comes from generated candidates that give the label "
            f"away ({leaks[0]}{f' and {len(leaks) - 1} more' if len(leaks) > 1 else ''}); they measure the "
            f"generator, not the models, and no transfer ratio is shown.**")


def to_markdown(result: dict) -> str:
    lines = [f"### {result['source']}: time-split test set ({result['window']['test']['rows']:,} rows, "
             f"CTR {result['window']['test']['ctr']:.3f}); FM {result['fm_class']}", ""]
    for table in result["consumers"].values():
        lines += consumer_markdown(table) + [""]
    a = result["autoencoder"]
    recon = (f", on the reconstruction {a['fm_head_ne_reconstructed']:.4f}" if "fm_head_ne_reconstructed" in a else "")
    lines += [f"Autoencoder ({result['embedding_dims'][0]} -> {result['embedding_dims'][1]} floats): reconstruction "
              f"MSE {a['reconstruction_mse']:.4g} (per-dimension embedding variance {a['embedding_variance']:.4g}); FM NE "
              f"{a['fm_head_ne_original']:.4f}{recon}.",
              f"Paper reference: KD transfers {REFERENCE['kd_transfer']}, SOLARIS {REFERENCE['solaris_transfer']}.",
              f"Trained on {result['device']} in {result['seconds']} s."]
    return "\n".join(lines)


def without_predictions(result: dict) -> dict:
    """The result as JSON keeps it: no per-row predictions, at the top or per consumer."""
    out = {k: v for k, v in result.items() if k != "predictions"}
    if "consumers" in out:
        out["consumers"] = {n: {k: v for k, v in t.items() if k != "predictions"} for n, t in out["consumers"].items()}
    return out


def write_report(result: dict, out: Path, markdown: str | None = None) -> tuple[Path, Path]:
    """The result as JSON (without the per-row predictions) and Markdown (``markdown``, else
    ``to_markdown(result)``) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"model_eval_{result['source'] or 'all'}"
    js, md = stem.with_suffix(".json"), stem.with_suffix(".md")
    js.write_text(json.dumps(without_predictions(result), indent=1, default=float))
    md.write_text((markdown or to_markdown(result)) + "\n")
    return js, md
