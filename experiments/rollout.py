"""Rollout replay: the consumer's NE hour by hour across a new FM and autoencoder, with the rollout
protocol, without any rollout, and served the new codes without it (the skew).

    python -m experiments.rollout                     # synthetic world (48 h), quick models

1. trains model set A (FM, autoencoder, verifier) on the requests before ``start - 1 h`` and runs
   the hourly cycle (spark_jobs/cycle.py) from ``start`` to ``promote``;
2. at ``promote``: trains the consumer's VM + SOLARIS on what A served (``vm_click_solaris``, the
   daily DAG's served training) and promotes it, then trains FM and autoencoder B on the requests
   before ``promote - 1 h`` (a daily refresh: a day more of data, another seed) and names them the
   newest: the cycles from ``promote`` to ``end`` run the rollout (A served, B written beside it and
   resolved in shadow);
3. at ``switch`` the consumer would be retrained on B's shadow rows of [promote, switch) and promoted:
   the replay trains that VM too. From ``switch`` on, the protocol serves it B's codes, which are
   B's shadow rows: the same tables read by the same rule, whether B is served or in shadow (so
   one replay gives every arm; misses are queued for what A served, as the lookup queues them
   before the switch);
4. scores, hour by hour over [promote, end), on the same requests:
   - ``no rollout``: VM_A on A's codes, as if B had never come;
   - ``protocol``: VM_A on A's codes before the switch, VM_B on B's from it;
   - ``skew``: VM_A on B's codes from ``promote`` (a new FM served without code spaces);
   - ``skew, retrained early``: VM_B on A's codes (the consumer switched before the codes did);
   - ``no codes``: VM_A with every row tier none: what the embedding is worth at all.
   Each hour's NE has a paired bootstrap interval over its requests; one training seed (labelled).

Writes ``<reports>/rollout_<data>/result.json`` and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

ARMS = ("no rollout", "protocol", "skew", "skew, retrained early", "no codes")


@dataclass(frozen=True)
class RolloutWindow:
    """Cycles at every hour end in (start, end]; B is promoted at ``promote``, the consumer
    switches at ``switch``."""

    start: datetime
    promote: datetime
    switch: datetime
    end: datetime

    def __post_init__(self):
        if not self.start < self.promote < self.switch < self.end:
            raise ValueError(f"need start < promote < switch < end, got {self.start}, {self.promote}, "
                             f"{self.switch}, {self.end}")


WINDOW = RolloutWindow(datetime(2026, 1, 5, 18), datetime(2026, 1, 6, 6), datetime(2026, 1, 6, 18),
                       datetime(2026, 1, 7, 0))


def predict(vm, vocab, rows: pd.DataFrame, events, items, dim: int, masked: bool = False) -> np.ndarray:
    """The VM's click probabilities on ``rows`` fed their codes (``masked``: none)."""
    from model.features import build_examples, row_inputs
    from model.served_training import masked as without_codes
    from model.served_training import served_inputs
    from model.train import infer, sigmoid
    from model.training import vm_ids

    x = {**row_inputs(build_examples(rows, events, vocab, 1, items)), **vm_ids(vocab, rows)}
    fed = served_inputs(rows, dim)
    return sigmoid(infer(vm, vm, {**x, **(without_codes(fed) if masked else fed)}))


def hourly(old: pd.DataFrame, new: pd.DataFrame, vm_old, vm_new, switch, events, items, dim: int,
           resamples: int = 1000, seed: int = 7) -> list[dict]:
    """The arms' NE per hour on the candidates served in both code spaces (``old``: what A served,
    ``new``: what B served or would have), then over the hours before and after the switch, each
    with a paired bootstrap interval over the requests and its difference from ``no rollout``. ``vm_old``, ``vm_new``: (VM, vocab) of the
    consumer trained on A and on B."""
    from model import metrics

    key = ["request_id", "item_id"]
    both = old.merge(new[key + ["tier", "embedding"]], on=key, suffixes=("", "_new"), validate="one_to_one")
    if not len(both):
        raise ValueError("no candidate was resolved in both code spaces: was the window replayed with a rollout?")
    as_new = both.drop(columns=["tier", "embedding"]).rename(columns={"tier_new": "tier", "embedding_new": "embedding"})
    (vm_a, vocab_a), (vm_b, vocab_b) = vm_old, vm_new
    p = {"no rollout": predict(vm_a, vocab_a, both, events, items, dim),
         "skew": predict(vm_a, vocab_a, as_new, events, items, dim),
         "skew, retrained early": predict(vm_b, vocab_b, both, events, items, dim),
         "no codes": predict(vm_a, vocab_a, both, events, items, dim, masked=True)}
    on_new = predict(vm_b, vocab_b, as_new, events, items, dim)
    after = (both["ts"] >= pd.Timestamp(switch)).to_numpy()
    p["protocol"] = np.where(after, on_new, p["no rollout"])
    y = both["label"].to_numpy()
    hours = both["ts"].dt.floor("h")
    # every hour, then the hours before and after the switch pooled
    groups = [(str(h), bool(h >= pd.Timestamp(switch)), (hours == h).to_numpy()) for h in sorted(hours.unique())]
    groups += [(name, flag, after == flag) for name, flag in (("before the switch", False), ("after the switch", True))
               if (after == flag).any()]
    out = []
    for label, switched, rows in groups:
        preds = {arm: p[arm][rows] for arm in ARMS}
        ci = metrics.paired_bootstrap(y[rows], preds, both.loc[rows, "request_id"].to_numpy(), baseline="no rollout",
                                      resamples=resamples, seed=seed)
        out.append({"hour": label, "after_switch": switched, "rows": int(rows.sum()),
                    "requests": int(both.loc[rows, "request_id"].nunique()), "ctr": float(y[rows].mean()),
                    "exact_share": {"old": float((both.loc[rows, "tier"] == "exact").mean()),
                                    "new": float((as_new.loc[rows, "tier"] == "exact").mean())},
                    **{arm: {"ne": metrics.normalized_entropy(y[rows], preds[arm]), "ne_ci": ci[arm]["ne"],
                             "vs_no_rollout_pct": ci[arm]["ne_delta_pct"], "vs_no_rollout_pct_ci": ci[arm]["ne_delta_pct_ci"]}
                       for arm in ARMS}})
    return out


def rows_of(cfg, tables_root, start, end, source, table: str, code_version: str) -> pd.DataFrame:
    """The labelled candidates of [start, end) resolved in ``code_version`` (``table``: request_features
    or shadow_request_features of the lake at ``tables_root``)."""
    from model import data as mdata

    rows = mdata.served_rows(cfg, start, end, source, tables_root=tables_root, table=table)
    return rows[rows["code_version"] == code_version].reset_index(drop=True)


def to_markdown(result: dict) -> str:
    w = result["window"]
    lines = [f"Cycles {w['start']} .. {w['end']}; B promoted at {w['promote']}, the consumer switched at {w['switch']}. "
             f"VM_A trained on {result['vm_a_rows']:,} rows served in A, VM_B on {result['vm_b_rows']:,} rows of B's "
             f"shadow; one training seed ({result['seed']}); intervals: paired bootstrap over each hour's requests.", "",
             "| hour | rows | exact A / B | " + " | ".join(ARMS) + " |", "|---|---:|---:|" + "---:|" * len(ARMS)]
    for h in result["hours"]:
        cells = []
        for arm in ARMS:
            a = h[arm]
            cells.append(f"{a['ne']:.4f}" if arm == "no rollout" else
                         f"{a['ne']:.4f} ({a['vs_no_rollout_pct']:+.1f}% [{a['vs_no_rollout_pct_ci'][0]:+.1f}, "
                         f"{a['vs_no_rollout_pct_ci'][1]:+.1f}])")
        mark = " (switched)" if h["after_switch"] and h["hour"][0].isdigit() else ""
        name = h["hour"][5:16] if h["hour"][0].isdigit() else f"**{h['hour']}**"
        lines.append(f"| {name}{mark} | {h['rows']:,} | {h['exact_share']['old']:.0%} / "
                     f"{h['exact_share']['new']:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(spark, cfg, source: str, w: RolloutWindow, ec, log=print) -> dict:
    from experiments import coverage_sweep as sweep
    from experiments.replay import pin_models
    from model import data as mdata
    from model import registry, served_training, training
    from model.inference import load_vm
    from model.promotion import SERVED
    from spark_jobs import cycle
    from spark_jobs.backfill import interval_ends

    t0 = time.perf_counter()
    log(f"model set A on {source} requests before {w.start - timedelta(hours=1)}")  # as the replay trains
    a_models = training.train_all(cfg, source, ec, log=log, until=w.start - timedelta(hours=1))["models"]
    # a rollout that writes A to the end: every arm reads both spaces
    acfg = pin_models(cfg, a_models).with_overrides(models={"rollout": True, "rollout_overlap_hours": 1e6})
    point = sweep.SweepPoint(cfg.precompute.budget, cfg.precompute.ttl_hours)
    lake = sweep.point_config(acfg, point, folder="rollout", tag="rollout")
    shutil.rmtree(lake.lake.root_path, ignore_errors=True)
    sweep.register_inputs(spark, acfg, lake)
    ends = interval_ends(w.start - timedelta(hours=1), w.end, 1.0)  # cycles at start .. end
    a = registry.code_version(registry.resolve_models(lake))
    for t in [t for t in ends if t < w.promote]:
        log(f"  cycle at {t} (A)")
        cycle.run(spark, lake, t, record_misses=True, log=lambda *_: None)

    consumer = training.ModelChoice.from_config(cfg).consumers[0]
    events, items = mdata.events_and_items(cfg, source)
    dim = registry.autoencoder_code_dim(a_models["autoencoder"])
    tables = lake.lake.tables_path

    def consumer_vm(rows: pd.DataFrame, space: str) -> tuple[str, int]:
        vm, result = served_training.train_on_served(consumer, rows, events, items, dim, ec, cfg.models.device, log)
        vocab = json.dumps(result.pop("vocab").values)
        result.pop("window")
        path = registry.save(cfg.models_root, registry.consumer_name(consumer.name, "solaris"), vm, result,
                             {"trained_on": SERVED, "code_version": space}, {"vocab.json": vocab})
        return str(path), len(rows)

    # what the daily DAG at ``promote`` has: the rows resolved so far (to the hour before it)
    hour = timedelta(hours=1)
    vm_a, n_a = consumer_vm(rows_of(cfg, tables, w.start, w.promote - hour, source, "request_features", a), a)
    registry.promote(cfg.models_root, registry.consumer_name(consumer.name, "solaris"), Path(vm_a).name)
    log(f"model set B on {source} requests before {w.promote - timedelta(hours=1)}")
    seeded = lambda t: replace(t, seed=t.seed + 100)  # noqa: E731  another training run, not a copy
    b_set = replace(ec, fm_train=seeded(ec.fm_train), ae_train=seeded(ec.ae_train))
    b_models = training.train_all(cfg, source, b_set, log=log, until=w.promote - timedelta(hours=1))["models"]
    lake = lake.with_overrides(models={"fm_version": Path(b_models["fm"]).name,
                                       "ae_version": Path(b_models["autoencoder"]).name})
    b = registry.code_version(registry.resolve_models(lake))
    spaces = registry.code_spaces(lake)
    if (spaces.serving, spaces.shadow) != (a, b):
        raise RuntimeError(f"the rollout did not start: {spaces}")
    for t in [t for t in ends if t >= w.promote]:  # the publication at promote already names B's shadow
        log(f"  cycle at {t} (A served, B in shadow)")
        cycle.run(spark, lake, t, record_misses=True, log=lambda *_: None)
    vm_b, n_b = consumer_vm(rows_of(cfg, tables, w.promote, w.switch - hour, source, "shadow_request_features", b), b)

    old = rows_of(cfg, tables, w.promote, w.end, source, "request_features", a)
    new = rows_of(cfg, tables, w.promote, w.end, source, "shadow_request_features", b)
    hours = hourly(old, new, load_vm(vm_a, cfg.allowed_classes), load_vm(vm_b, cfg.allowed_classes), w.switch,
                   events, items, dim, seed=ec.split.seed)
    return {"source": source, "window": {k: str(getattr(w, k)) for k in ("start", "promote", "switch", "end")},
            "code_versions": {"A": a, "B": b}, "vm_a": vm_a, "vm_b": vm_b, "vm_a_rows": n_a, "vm_b_rows": n_b,
            "seed": ec.vm_train.seed, "hours": hours, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    from include import synthetic_world
    from include.config import MODEL_SIZES

    p = argparse.ArgumentParser(prog="python -m experiments.rollout", description=__doc__.split("\n\n")[0])
    synthetic_world.add_arguments(p)
    p.set_defaults(synthetic_hours=48)
    for name in ("start", "promote", "switch", "end"):
        p.add_argument(f"--{name}", help=f"UTC, ISO, a whole hour (default {getattr(WINDOW, name)})")
    p.add_argument("--models", choices=MODEL_SIZES, help="model sizes (default: [models] sizes)")
    p.add_argument("--skip-ingest", action="store_true", help="use the log already in the lake")
    p.add_argument("--reports", default="reports", help="the report goes to <reports>/rollout_synthetic/")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.cli import parse_time
    from include.config import load_config
    from include.spark import get_spark
    from model import training

    try:
        w = RolloutWindow(*(parse_time(getattr(a, k)) if getattr(a, k) else getattr(WINDOW, k)
                            for k in ("start", "promote", "switch", "end")))
    except ValueError as e:
        p.error(str(e))
    cfg = load_config(a.config)
    spark = get_spark(cfg)
    if not a.skip_ingest:
        from spark_jobs.ingest import ingest, write_synthetic

        ingest(spark, cfg, "synthetic", write_synthetic(cfg, wcfg=synthetic_world.from_arguments(a)))
    result = run(spark, cfg, "synthetic", w, training.model_set(a.models or cfg.models.sizes),
                 log=lambda s: print(s, flush=True))
    out = Path(a.reports) / "rollout_synthetic"
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "report.md").write_text(to_markdown(result) + "\n")
    print("\n" + to_markdown(result) + f"\n\nwrote {out}/report.md and result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
