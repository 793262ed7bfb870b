"""How fast the FM's knowledge goes stale: what a precomputed embedding can hold that an online FM
would not lose.

A served embedding was computed by a precompute run before the request: at best at the start of
the request's hour, at worst a TTL earlier. This scores the FM on the test split of its training
(the split ``experiments.model_eval`` reports) with its history and counters read as of the
request (an online FM), as of the start of the request's hour (the freshest a precompute run can
be), and ``lag`` hours before the request. The candidate, context, position and label stay the
request's; only the time the FM's inputs are read as of moves. NE and AUC per lag with paired
bootstrap intervals over the test requests, and the NE change against the FM as of the request.

    python -m experiments.staleness --source synthetic --lags 1,3,6
    python -m experiments.staleness --until 2026-01-07T23:00   # a replay's initial FM (trained before its start)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from include.config import MODEL_SIZES
from model import data as mdata
from model import metrics, registry, training
from model.features import Vocab, build_examples, model_inputs
from model.train import infer, sigmoid

AS_OF_REQUEST, AS_OF_HOUR = "as of the request", "as of the start of its hour"


def as_of_times(ts: pd.Series, lags_hours: list[float]) -> dict[str, pd.Series]:
    """The times the FM's inputs are read as of, by name: the request, its hour's start, each lag."""
    ts = pd.to_datetime(ts)
    out = {AS_OF_REQUEST: ts, AS_OF_HOUR: ts.dt.floor("h")}
    for lag in lags_hours:
        if lag <= 0:
            raise ValueError(f"lags are hours before the request, > 0; got {lag}")
        out[f"{lag:g} h before the request"] = ts - pd.Timedelta(hours=lag)
    return out


def run(cfg, source: str | None, ec: training.ModelSetConfig, lags_hours: list[float], until=None) -> dict:
    path = Path(registry.resolve_models(cfg)["fm"])
    fm = registry.load_declared(path, "fm", cfg.allowed_classes)
    vocab = Vocab.load(path / "vocab.json")
    requests, events, items = mdata.load(cfg, source, until)
    test = mdata.split_by_time(requests, ec.split)["test"]
    y = test["label"].to_numpy(dtype=np.float32)
    preds = {}
    for name, at in as_of_times(test["ts"], lags_hours).items():
        x = build_examples(test.assign(ts=at.to_numpy()), events, vocab, fm.cfg.history_len, items, fm.cfg.horizon_hours)
        x["hour"] = pd.to_datetime(test["ts"]).dt.hour.to_numpy().astype(np.int64)  # the request's context
        preds[name] = sigmoid(infer(fm, fm, model_inputs(x, fm.inputs)))
    ci = metrics.paired_bootstrap(y, preds, test["request_id"].to_numpy(), baseline=AS_OF_REQUEST,
                                  resamples=ec.bootstrap_resamples, seed=ec.split.seed)
    rows = [{"as_of": name, **metrics.summary(y, p), "ne_ci": ci[name]["ne"], "auc_ci": ci[name]["auc"],
             "ne_vs_request_pct": ci[name]["ne_delta_pct"], "ne_vs_request_pct_ci": ci[name]["ne_delta_pct_ci"]}
            for name, p in preds.items()]
    return {"source": source, "fm": str(path), "rows": rows, "bootstrap": ci["_meta"],
            "test": {"rows": len(test), "requests": int(test["request_id"].nunique()), "ctr": float(y.mean())}}


def to_markdown(result: dict) -> str:
    t, fmt = result["test"], metrics.format_interval
    lines = [f"### {result['source']}: the FM with its inputs read earlier than the request "
             f"({t['rows']:,} test rows, {t['requests']:,} requests, CTR {t['ctr']:.3f})", "",
             "| FM inputs | NE [95% CI] | AUC [95% CI] | NE vs as of the request [95% CI] |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['as_of']} | {r['ne']:.4f} {fmt(r['ne_ci'], '.4f')} | {r['auc']:.4f} {fmt(r['auc_ci'], '.4f')} | "
                     f"{r['ne_vs_request_pct']:+.2f}% {fmt(r['ne_vs_request_pct_ci'], '+.2f')} |")
    b = result["bootstrap"]
    lines += ["", f"FM {result['fm']}. Intervals: paired bootstrap over the {b['groups']:,} test requests, "
              f"{b['resamples']:,} resamples."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.staleness", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="synthetic", help="the source the FM was trained on")
    p.add_argument("--lags", default="1,3,6", help="comma list of hours before the request")
    p.add_argument("--until", help="the end of the FM's training data (a replay's start, for its initial models); "
                                   "default: the whole log, as model_eval trains")
    p.add_argument("--models", choices=MODEL_SIZES, help="the model set whose split to test on (default: [models] sizes)")
    p.add_argument("--reports", default="reports", help="folder for the JSON and Markdown results")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        lags = [float(x) for x in a.lags.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lags must be a comma list of hours, got {a.lags!r}")
    from include.config import load_config

    cfg = load_config(a.config)
    result = run(cfg, a.source, training.model_set(a.models or cfg.models.sizes), lags, a.until)
    markdown = to_markdown(result)
    print(markdown)
    out = Path(a.reports)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"staleness_{a.source}.json").write_text(json.dumps(result, indent=1, default=float))
    (out / f"staleness_{a.source}.md").write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
