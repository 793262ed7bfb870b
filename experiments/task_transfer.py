"""One embedding, a task its FM never saw: the click FM's embedding fed to a conversion VM.

Soft labels are tied to the task their teacher predicts; an FM embedding is an input that any model
can read. On a log with a second label (the synthetic world's conversion after a click; a row
without a known conversion is left out of the conversion task) this trains, on one time split:

1. the model set on clicks (``model.training.train_frames``): the click FM and its autoencoder;
2. the model set on conversions: the conversion VM, VM + KD with the conversion FM as teacher,
   VM + the conversion FM's embedding (oracle coverage) and the conversion FM itself;
3. from the click FM alone, two more conversion VMs: VM + the click FM's embedding (oracle
   coverage) and VM + KD with the click FM's click probability as the teacher (the only soft label
   a click FM has for a task it never predicted).

Transfer ratios are shares of the conversion FM's NE gain over the conversion VM, with paired
bootstrap intervals over test requests; on a simulated log also the Bayes NE of the conversion
label and the share of the VM-to-Bayes gap each model closes.

    python -m experiments.task_transfer --data synthetic     # generate the world, ingest, train, compare
    python -m experiments.task_transfer --source synthetic --skip-ingest
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from model import data as mdata
from model import metrics, training
from model.features import Vocab, build_examples
from model.train import bce_loss, fit, infer, kd_loss, pick_device, sigmoid
from model.vm import VerticalModel, VMConfig

# The conversion task's rows, as train_frames names them, and the two from the click FM.
NAMES = {"VM": "VM", "VM + KD (soft labels)": "VM + KD (conversion FM teacher)",
         "VM + FM embedding (oracle coverage)": "VM + conversion-FM embedding (oracle)", "FM": "conversion FM"}
CLICK_KD, CLICK_EMBEDDING = "VM + KD (click FM teacher)", "VM + click-FM embedding (oracle)"
ORDER = ["VM", "VM + KD (conversion FM teacher)", CLICK_KD, "VM + conversion-FM embedding (oracle)", CLICK_EMBEDDING,
         "conversion FM"]


def load_two_labels(cfg, source: str | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(requests with ``label`` and ``conversion``, events, items)."""
    requests, events, items = mdata.load(cfg, source)
    conv = mdata.read_table(cfg, "request_log", ["request_id", "item_id", "conversion"], source)
    return requests.merge(conv, on=["request_id", "item_id"], how="left", validate="one_to_one"), events, items


def conversion_task(requests: pd.DataFrame, source: str | None) -> pd.DataFrame:
    """The rows with a known conversion, labelled with it; an error when no row has one."""
    known = requests["conversion"].notna()
    if not known.any():
        raise ValueError(f"source {source!r} has no conversion label: the conversion task needs a log with one "
                         "(the synthetic world has it; an impression log's optional `conversion` column)")
    return requests[known].assign(label=lambda d: d["conversion"].astype(int))


def run(cfg, source: str | None, ec: training.ModelSetConfig, log=print) -> dict:
    t0 = time.perf_counter()
    device = pick_device(cfg.models.device)
    requests, events, items = load_two_labels(cfg, source)
    log("click task")
    _, click_models, click_extras = training.train_frames(requests, events, items, ec, cfg.models.device, log)
    conversions = conversion_task(requests, source)
    log("conversion task")
    conv, _, conv_extras = training.train_frames(conversions, events, items, ec, cfg.models.device, log)

    # The conversion task's split as train_frames drew it (same requests, same seed); the click FM
    # reads it through its own vocabulary, the conversion VMs through theirs.
    splits = mdata.split_by_time(conversions, ec.split)
    vocab = {"click": Vocab(json.loads(click_extras["vocab.json"])), "conv": Vocab(json.loads(conv_extras["vocab.json"]))}
    fm_x = {k: build_examples(v, events, vocab["click"], ec.history_len, items, ec.horizon_hours) for k, v in splits.items()}
    vm_x = {k: build_examples(v, events, vocab["conv"], 1, items, ec.horizon_hours) for k, v in splits.items()}
    fm, ae = click_models["FM"], click_models["autoencoder"]
    click_p = {k: sigmoid(infer(fm, fm, v, device=device)) for k, v in fm_x.items()}
    ae.to(device).eval()  # infer() moves and evals the FM; the autoencoder runs inside its pass
    codes = {k: infer(lambda b: ae.encode(fm.embed(b)), fm, v, device=device) for k, v in fm_x.items()}

    vm_train = replace(ec.vm_train, device=str(device))
    sizes = dict(n_users=vocab["conv"].size("user"), n_items=vocab["conv"].size("item"),
                 n_devices=vocab["conv"].size("device"), n_surfaces=vocab["conv"].size("surface"))
    predictions = conv["predictions"].rename(columns=NAMES)
    for name, use_fm, loss, inputs in (
            (CLICK_KD, False, kd_loss(ec.kd_alpha), lambda k: training.vm_inputs(vm_x[k], None, click_p[k])),
            (CLICK_EMBEDDING, True, bce_loss, lambda k: training.vm_inputs(vm_x[k], codes[k]))):
        log(f"  training {name}")
        torch.manual_seed(vm_train.seed)
        vm = VerticalModel(VMConfig(**sizes, use_fm_embedding=use_fm, fm_dim=ec.code_dim))
        fit(vm, loss, inputs("train"), inputs("val"), vm_train, log)
        predictions[name] = sigmoid(infer(vm, vm, inputs("test"), device=device))

    y = predictions["label"].to_numpy()
    if not np.array_equal(y, vm_x["test"]["label"]):
        raise RuntimeError("the conversion task's test rows differ from train_frames': the split is not reproducible")
    preds = {m: predictions[m].to_numpy() for m in ORDER}
    ci = metrics.paired_bootstrap(y, preds, predictions["request_id"].to_numpy(), baseline="VM",
                                  reference="conversion FM", resamples=ec.bootstrap_resamples, seed=ec.split.seed)
    ne_vm, ne_fm = metrics.normalized_entropy(y, preds["VM"]), metrics.normalized_entropy(y, preds["conversion FM"])
    rows = []
    for m in ORDER:
        s = metrics.summary(y, preds[m])
        rows.append({"model": m, **s, "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm,
                     "transfer_ratio": metrics.transfer_ratio(ne_vm, s["ne"], ne_fm), "ne_ci": ci[m]["ne"],
                     "auc_ci": ci[m]["auc"], "ne_vs_vm_pct_ci": ci[m]["ne_delta_pct_ci"],
                     "transfer_ratio_ci": ci[m]["transfer_ratio_ci"]})
    return {"source": source, "rows": rows, "predictions": predictions, "bootstrap": ci["_meta"],
            "fm_beats_vm": ci["_meta"]["reference_beats_baseline"], "window": mdata.window(splits, source),
            "seconds": round(time.perf_counter() - t0, 1)}


def to_markdown(result: dict) -> str:
    w, fmt = result["window"]["test"], metrics.format_interval
    lines = [f"### {result['source']}: conversion task, time-split test set ({w['rows']:,} rows, "
             f"conversion rate {w['ctr']:.4f})", "",
             "| model | NE [95% CI] | AUC [95% CI] | calibration | NE vs VM [95% CI] | transfer ratio [95% CI] |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        tr = ("" if r["model"] in ("VM", "conversion FM") else
              metrics.transfer_label(r["transfer_ratio"], r["transfer_ratio_ci"], result["fm_beats_vm"]))
        lines.append(f"| {r['model']} | {r['ne']:.4f} {fmt(r['ne_ci'], '.4f')} | {r['auc']:.4f} {fmt(r['auc_ci'], '.4f')} | "
                     f"{r['calibration']:.3f} | {r['ne_vs_vm_pct']:+.2f}% {fmt(r['ne_vs_vm_pct_ci'], '+.2f')} | {tr} |")
    b = result["bootstrap"]
    lines += ["", f"Intervals: paired bootstrap over the {b['groups']:,} test requests, {b['resamples']:,} resamples. "
              "Transfer ratios: shares of the conversion FM's NE gain over the conversion VM. The click FM never "
              f"saw a conversion label. {result['seconds']} s."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from experiments import model_eval, truth

    p = model_eval.arguments("python -m experiments.task_transfer", __doc__.split("\n\n")[0])
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    cfg, source, ec = model_eval.prepare(p, a)
    print(f"training on source {source!r}, clicks and conversions")
    result = run(cfg, source, ec)
    markdown = to_markdown(result)
    known = truth.read_truth(cfg.lake.tables_path, source)
    if known is not None:
        result["bayes"] = truth.bayes_gap(result["predictions"], known, ORDER, resamples=ec.bootstrap_resamples,
                                          seed=ec.split.seed, column="p_conversion")
        markdown += "\n\n" + truth.to_markdown(result["bayes"])
    print("\n" + markdown)
    out = Path(a.reports)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"task_transfer_{source or 'all'}"
    stem.with_suffix(".json").write_text(json.dumps({k: v for k, v in result.items() if k != "predictions"},
                                                    indent=1, default=float))
    stem.with_suffix(".md").write_text(markdown + "\n")
    print(f"\nwrote {stem}.json and {stem.name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
