"""What an online session feature adds to every VM variant of a finished replay.

    python -m experiments.session_features --data synthetic     # after make evaluate DATA=synthetic

An exact hit's code is computed before the request, so it cannot know what the user did earlier in
the same visit (docs/results.md, the vintage ablation); a VM can, online, from its own log. This
trains every VM variant of the replay (plain, KD, served, exact only, oracle) twice on the same
served rows and seeds (experiments/replay_eval.py): as the replay did, and reading the user's last
click before the request and its age (``ReplayEvalConfig.session_features``, model.vm). It reports
each setting's table against its own plain VM (transfer ratios are against that VM and the FM), and
every model of both settings against the plain VM without the feature: the paired bootstrap over
training seeds, then test requests.

It reads the replay's report (``<reports>/replay_<data>/result.json``: window, main setting, model
versions) and that setting's lake; it writes ``session_features.md`` and ``.json`` beside the report.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

SESSION = " + session"  # the suffix of a model that reads the session feature
BASELINE = "VM"


def finished_replay(cfg, report_dir: Path) -> dict:
    """The replay's window, main setting, its lake's tables and the FM and autoencoder it served with."""
    from experiments import coverage_sweep as sweep

    path = report_dir / "result.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the replay first (make evaluate)")
    r = json.loads(path.read_text())
    point = r["points"][r["main"]]
    pcfg = sweep.point_config(cfg, sweep.SweepPoint(point["budget"], point["ttl_hours"]), folder="replay", tag="replay")
    models = {k: Path(r["initial_models"]["models"][k]) for k in ("fm", "autoencoder")}
    for what, p in [("the replay's lake", pcfg.lake.tables_path), *models.items()]:
        if not p.exists():
            raise FileNotFoundError(f"{what} {p} not found: the report {path} is from another lake (SOLARIS_LAKE_ROOT)")
    return {"source": r["source"], "main": r["main"], "tables": pcfg.lake.tables_path, "models": models,
            "window": {k: datetime.fromisoformat(r["window"][k]) for k in ("start", "end", "test_from")}}


def seed_matrix(predictions: pd.DataFrame, model: str) -> np.ndarray:
    """(S, n) predictions of one model from ``evaluate``'s predictions frame (a column per seed, or one)."""
    cols = [c for c in predictions.columns if c == model or c.startswith(f"{model} [seed ")]
    if not cols:
        raise KeyError(f"no predictions of {model!r}")
    return predictions[cols].to_numpy().T


def compare(cfg, replay: dict, ec, log=print) -> dict:
    """Every VM variant trained without and with the session feature; both tables, and each model
    against the plain VM without it."""
    from experiments import replay_eval
    from model import metrics
    from model.inference import load_fm_encoder

    w = replay["window"]
    fm, ae, fm_vocab = load_fm_encoder(str(replay["models"]["fm"]), str(replay["models"]["autoencoder"]),
                                       cfg.allowed_classes)
    rows = replay_eval.served_rows(cfg, replay["tables"], w["start"], w["end"], replay["source"])
    runs = {}
    for on in (False, True):
        log(f"the VM variants {'with' if on else 'without'} the session feature")
        runs[on] = replay_eval.evaluate(cfg, {replay["main"]: rows}, replay["main"], w["test_from"], fm, ae, fm_vocab,
                                        replay["source"], replace(ec, session_features=on), log)
    before, after = runs[False]["predictions"], runs[True]["predictions"]
    if not before[["request_id", "item_id"]].equals(after[["request_id", "item_id"]]):
        raise AssertionError("the two settings were tested on different rows")
    models = [r["model"] for r in runs[False]["rows"]]
    preds = {m: seed_matrix(before, m) for m in models}
    preds.update({m + SESSION: seed_matrix(after, m) for m in models if m != "FM"})
    y = before["label"].to_numpy()
    ci = metrics.paired_bootstrap(y, preds, before["request_id"].to_numpy(), baseline=BASELINE, reference="FM",
                                  resamples=ec.bootstrap_resamples, seed=ec.seeds[0])
    ne = {m: metrics.seed_mean_ne(y, p) for m, p in preds.items()}
    against = [{"model": m, "ne": ne[m], "ne_vs_vm_pct": 100 * (ne[m] - ne[BASELINE]) / ne[BASELINE],
                "ne_vs_vm_pct_ci": ci[m]["ne_delta_pct_ci"],
                "transfer_ratio": metrics.transfer_ratio(ne[BASELINE], ne[m], ne["FM"]),
                "transfer_ratio_ci": ci[m].get("transfer_ratio_ci")} for m in preds]
    keep = ("rows", "by_tier", "gated_tiers", "vintage_ablation", "fm_beats_vm", "window", "seeds", "seconds")
    return {"source": replay["source"], "main": replay["main"], "test_rows": int(len(y)),
            "window": {k: str(v) for k, v in w.items()},
            "without": {k: runs[False][k] for k in keep}, "with": {k: runs[True][k] for k in keep},
            "against_vm": against, "fm_beats_vm": ci["_meta"]["reference_beats_baseline"], "bootstrap": ci["_meta"]}


def _pct(x, ci=None) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x:+.2f}%" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci is not None and np.all(np.isfinite(ci)) else "")


def _ratio(r: dict, beats: bool) -> str:
    t, ci = r.get("transfer_ratio"), r.get("transfer_ratio_ci")
    if not beats or t is None or not np.isfinite(t) or r["model"] in (BASELINE, "FM"):
        return "-"
    return f"{100 * t:.0f}%" + (f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci and np.all(np.isfinite(ci)) else "")


def to_markdown(result: dict) -> str:
    out = [f"# Session feature: {result['source']}, setting {result['main']}", "",
           f"Test rows: {result['test_rows']:,} ({result['window']['test_from']} to {result['window']['end']}); "
           f"seeds {result['without']['seeds']}; intervals: paired bootstrap over the seeds, then the test requests "
           f"({result['bootstrap']['resamples']} resamples, {100 * result['bootstrap']['level']:.0f}%).", "",
           "## Each setting against its own plain VM", "",
           "| model | NE without | vs its VM | transfer | NE with the session feature | vs its VM | transfer |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    w, s = result["without"], result["with"]
    with_rows = {r["model"]: r for r in s["rows"]}
    for r in w["rows"]:
        t = with_rows[r["model"]]
        out.append(f"| {r['model']} | {r['ne']:.4f} | {_pct(r['ne_vs_vm_pct'], r['ne_vs_vm_pct_ci'])} | "
                   f"{_ratio(r, w['fm_beats_vm'])} | {t['ne']:.4f} | {_pct(t['ne_vs_vm_pct'], t['ne_vs_vm_pct_ci'])} | "
                   f"{_ratio(t, s['fm_beats_vm'])} |")
    out += ["", "A transfer ratio is printed only where the FM beats that setting's VM with an interval "
            "excluding zero. The FM row is the same model in both settings (it reads no session feature "
            "of the VM's).", "", "## Every model against the plain VM without the feature", "",
            "| model | NE | vs VM | transfer |", "|---|---:|---:|---:|"]
    out += [f"| {r['model']} | {r['ne']:.4f} | {_pct(r['ne_vs_vm_pct'], r['ne_vs_vm_pct_ci'])} | "
            f"{_ratio(r, result['fm_beats_vm'])} |" for r in result["against_vm"]]
    out += ["", "## Served VM by tier, against its own plain VM", "",
            "| tier | share | without | with the session feature |", "|---|---:|---:|---:|"]
    with_tiers = {t["tier"]: t for t in s["by_tier"]}
    for t in w["by_tier"]:
        if not t.get("pairs"):
            continue
        u = with_tiers[t["tier"]]
        out.append(f"| {t['tier']} | {100 * t['share']:.1f}% | {_pct(t['served_vs_vm_pct'], t['served_vs_vm_pct_ci'])} | "
                   f"{_pct(u['served_vs_vm_pct'], u['served_vs_vm_pct_ci'])} |")
    for name, run in (("without", w), ("with the session feature", s)):
        v = run.get("vintage_ablation")
        if v:
            out += ["", f"## Vintage ablation {name}: the {v['rows']:,} {v['tier']} test rows, NE vs that setting's VM", "",
                    "| model, fed | NE vs VM |", "|---|---:|"]
            out += [f"| {r['model']} | {_pct(r['ne_vs_vm_pct'], r['ne_vs_vm_pct_ci'])} |" for r in v["table"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from experiments.replay import WINDOWS

    p = argparse.ArgumentParser(prog="python -m experiments.session_features", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=sorted(WINDOWS["long"]), default="synthetic")
    p.add_argument("--reports", default="reports", help="the replay's report is <reports>/replay_<data>/")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--seeds", type=int, default=3, help="train every VM variant with this many seeds (seed, seed + 1, ...)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.seeds < 1:
        p.error(f"--seeds must be >= 1, got {a.seeds}")
    if a.resamples < 1:
        p.error(f"--resamples must be >= 1, got {a.resamples}")

    from experiments import replay_eval
    from experiments.replay_report import jsonable
    from include.config import load_config

    cfg = load_config(a.config)
    base = replay_eval.ReplayEvalConfig()
    ec = replace(base, vm_train=replace(base.vm_train, seed=a.seed), seeds=tuple(range(a.seed, a.seed + a.seeds)),
                 bootstrap_resamples=a.resamples)
    out = Path(a.reports) / f"replay_{a.data}"
    try:
        result = compare(cfg, finished_replay(cfg, out), ec, log=lambda s: print(s, flush=True))
    except (FileNotFoundError, ValueError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    (out / "session_features.json").write_text(json.dumps(result, indent=1, default=jsonable))
    md = to_markdown(result)
    (out / "session_features.md").write_text(md)
    print("\n" + md)
    print(f"wrote {out}/session_features.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
