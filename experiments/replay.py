"""Replay evaluation: does a VM fed by speculative precompute keep the FM's gain, and at what FM cost?

    python -m experiments.replay                       # synthetic default (generates, ingests, replays)
    python -m experiments.replay --data mind --input ../shared/datasets/mind_small_subset
    python -m experiments.replay --data globo --input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz' \\
        --sample-fraction 0.05

1. trains the FM, autoencoder and verifier VM on the requests before the replay (``model.training.train_all``,
   saved in the registry and pinned for the replay);
2. replays the hourly cycle (spark_jobs/cycle.py, the code the hourly DAG runs: resolve the past
   hour's requests as of their timestamps, precompute, user means, neighbors, publish) for every
   hour of the replay, misses queued to ``miss_queue`` as the lookup does, once per precompute
   setting (budget, TTL), each in its own lake under ``<lake>/replay/<setting>/``;
3. trains the VM variants on the replay's logged ``request_features`` before ``test_from``, once per
   seed (``--seeds``), and evaluates them on the hours from it (experiments/replay_eval.py);
4. writes the report (Markdown, JSON and PNG plots) to ``<reports>/replay_<source>/``.

Each data set has two windows (``WINDOWS``): ``--window long`` (the default; 36 hours or more of
served rows for the VM variants) and ``--window quick`` (a few hours);
``--start/--end/--measure-from/--test-from`` override either. Deterministic given ``--seed`` up to
torch's multithreaded CPU kernels.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
from pyspark.sql import functions as F

from feature_store.resolution import TIERS
from include.config import MODEL_SIZES
from feature_store.tables import PRECOMPUTE_RUNS, REQUEST_FEATURES, qualified_name
from spark_jobs.ingest import add_log_arguments, check_log_arguments, log_arguments


@dataclass(frozen=True)
class ReplayWindow:
    """Cycles run at t = start, start + 1 h, ..., end; the cycle at t serves [t, t + 1 h) and
    resolves [t - 1 h, t). Models train on requests before start - 1 h. Coverage is counted over
    [measure_from, end); VM variants train on [start, test_from) and test on [test_from, end)."""

    start: datetime
    end: datetime
    measure_from: datetime
    test_from: datetime

    def __post_init__(self):
        if not self.start < self.measure_from <= self.test_from < self.end:
            raise ValueError(f"need start < measure_from <= test_from < end, got {self.start}, {self.measure_from}, "
                             f"{self.test_from}, {self.end}")
        for name in ("start", "end", "measure_from", "test_from"):
            t = getattr(self, name)
            if t != t.replace(minute=0, second=0, microsecond=0):
                raise ValueError(f"{name} {t} must be a whole hour: the cycles are hourly")

    @property
    def train_until(self) -> datetime:
        return self.start - timedelta(hours=1)

    @property
    def ends(self) -> list[datetime]:
        from spark_jobs.backfill import interval_ends

        return interval_ends(self.start, self.end, 1.0)


def _w(*ts: str) -> ReplayWindow:
    return ReplayWindow(*(datetime.fromisoformat(t) for t in ts))


WINDOWS = {  # start, end, measure_from, test_from (UTC)
    # long (the default): the VM variants learn from 36 or more hours of served rows, as a production
    # VM learns from days of logged features; the synthetic world runs 96 hours for it
    "long": {
        "synthetic": _w("2026-01-07T06:00", "2026-01-09T00:00", "2026-01-07T08:00", "2026-01-08T18:00"),
        "globo": _w("2017-10-09T00:00", "2017-10-11T00:00", "2017-10-09T02:00", "2017-10-10T18:00"),
        "mind": _w("2019-11-14T06:00", "2019-11-14T12:00", "2019-11-14T08:00", "2019-11-14T10:00"),
    },
    # quick: a few replay hours, where training noise can decide a comparison (minutes, not an hour)
    "quick": {
        "synthetic": _w("2026-01-06T08:00", "2026-01-06T15:00", "2026-01-06T10:00", "2026-01-06T13:00"),
        "globo": _w("2017-10-10T10:00", "2017-10-10T18:00", "2017-10-10T13:00", "2017-10-10T16:00"),
        "mind": _w("2019-11-14T06:00", "2019-11-14T12:00", "2019-11-14T08:00", "2019-11-14T10:00"),
    },
}
WORLD_HOURS = {"long": 96, "quick": 48}  # the synthetic world each window needs


def pin_models(cfg, saved: dict[str, str]):
    """The replay's config: the versions trained for it, not whatever is latest later, served
    whatever the registry's consumers read (no rollout)."""
    from model.registry import consumer_name

    verifier = saved[consumer_name(cfg.models.verifier)]
    return cfg.with_overrides(models={"root": str(cfg.models_root), "vm_version": Path(verifier).name,
                                      "fm_version": Path(saved["fm"]).name,
                                      "ae_version": Path(saved["autoencoder"]).name, "rollout": False})


def point_stats(spark, pcfg, w: ReplayWindow) -> dict:
    """What one setting's replay did: coverage by hour and tier, precompute work per cycle, the miss queue."""
    db = pcfg.lake.database
    served = spark.table(qualified_name(REQUEST_FEATURES, db)).where(
        (F.col("ts") >= F.lit(w.start - timedelta(hours=1))) & (F.col("ts") < F.lit(w.end)))
    hourly = {}
    for r in served.groupBy(F.date_trunc("hour", "ts").alias("hour"), "tier").count().collect():
        hourly.setdefault(r.hour, dict.fromkeys(TIERS, 0))[r.tier] = r["count"]
    runs = (spark.table(qualified_name(PRECOMPUTE_RUNS, db))
            .where(F.col("interval_end").between(F.lit(w.start), F.lit(w.end))).orderBy("interval_end")
            .select("interval_end", "pairs_considered", "pairs_scored", "pairs_selected", "already_fresh",
                    "pairs_embedded", "queue_in", "queue_waiting").collect())
    from spark_jobs import miss_queue

    queue = miss_queue.with_consumption(spark, db).groupBy("origin").agg(
        F.count("*").alias("pairs"), F.count("consumed_by_run").alias("consumed")).collect()
    return {"hourly": [{"hour": h, **hourly[h]} for h in sorted(hourly)],
            "cycles": [r.asDict() for r in runs],
            "miss_queue": {r.origin: {"pairs": r.pairs, "consumed": r.consumed} for r in queue}}


def lookup_latency(tables_root: Path, rows, requests: int = 2000) -> dict:
    """The serving path's added latency: the embedded lookup (OnlineStore, the newest snapshot)
    over the test hours' requests, one call per request, in this process."""
    from lookup.online import OnlineStore

    store = OnlineStore(tables_root, record_misses=False)
    store.poll_once()
    times = []
    for (_, user, ts), g in list(rows.groupby(["request_id", "user_id", "ts"], sort=False))[:requests]:
        items = g["item_id"].tolist()
        t = time.perf_counter()
        store.lookup(user, items, ts.to_pydatetime())
        times.append(1000 * (time.perf_counter() - t))
    return {"requests": len(times), "p50": float(np.percentile(times, 50)) if times else float("nan"),
            "p99": float(np.percentile(times, 99)) if times else float("nan"),
            "snapshot_run_id": store.status()["snapshot_run_id"]}


def run(spark, cfg, source: str, w: ReplayWindow, budgets: list[float], ttls: list[float], model_config,
        eval_config, log=print) -> dict:
    from experiments import replay_eval
    from model import registry, training
    from model.autoencoder import AEConfig, EmbeddingAutoencoder
    from model.features import Vocab
    from experiments import coverage_sweep as sweep

    t0 = time.perf_counter()
    log(f"training the FM, autoencoder and verifier on {source} requests before {w.train_until}")
    trained = training.train_all(cfg, source, model_config, log=log, until=w.train_until)
    rcfg = pin_models(cfg, trained["models"])
    main = sweep.SweepPoint(cfg.precompute.budget, cfg.precompute.ttl_hours)
    points = list(dict.fromkeys([main, *sweep.sweep_points(budgets, ttls, main.budget, main.ttl_hours, "cross")]))
    ends = w.ends
    results, rows_by_point, pcfgs = {}, {}, {}
    for i, p in enumerate(points, 1):
        pcfg = sweep.point_config(rcfg, p, folder="replay", tag="replay")
        shutil.rmtree(pcfg.lake.root_path, ignore_errors=True)  # every replay starts from an empty serving lake
        log(f"[{i}/{len(points)}] replaying {p.name}: {len(ends)} cycles {ends[0]} .. {ends[-1]}")
        coverage = sweep.replay(spark, rcfg, p, ends, w.measure_from, record_misses=True, pcfg=pcfg,
                                log=lambda s: log(s))
        results[p.name] = {"budget": p.budget, "ttl_hours": p.ttl_hours, "seconds": coverage[0]["seconds"],
                           "coverage": {r["tier"]: r["share"] for r in coverage},
                           "served": sum(r["pairs"] for r in coverage), **point_stats(spark, pcfg, w)}
        rows_by_point[p.name] = replay_eval.served_rows(cfg, pcfg.lake.tables_path, w.start,
                                                        w.end, source)
        pcfgs[p.name] = pcfg
    fm_path, ae_path = Path(trained["models"]["fm"]), Path(trained["models"]["autoencoder"])
    fm = registry.load_declared(fm_path, "fm", cfg.allowed_classes)
    ae = registry.load(ae_path, EmbeddingAutoencoder, AEConfig)
    log("training the VM variants on the replay's served features")
    fm_vocab = Vocab.load(fm_path / "vocab.json")
    variants = replay_eval.evaluate(cfg, rows_by_point, main.name, w.test_from, fm, ae, fm_vocab, source, eval_config, log)
    consumers = consumer_tables(cfg, rows_by_point[main.name], w, fm, ae, fm_vocab, source, eval_config, variants, log)
    test_rows = rows_by_point[main.name]
    latency = lookup_latency(pcfgs[main.name].lake.tables_path, test_rows[test_rows["ts"] >= w.test_from])
    from experiments import truth

    predictions, bayes = variants.pop("predictions"), None
    known = truth.read_truth(cfg.lake.tables_path, source)
    if known is not None:  # a simulated log: the floor under every variant
        bayes = truth.bayes_gap(predictions, known, list(replay_eval.VARIANTS),
                                resamples=eval_config.bootstrap_resamples, seed=eval_config.vm_train.seed)
    initial = {k: v for k, v in trained.items() if k in ("rows", "window", "models", "fm_beats_vm", "bootstrap")}
    if known is not None:
        initial["bayes"] = truth.bayes_gap(trained["predictions"], known, [x["model"] for x in trained["rows"]],
                                           resamples=model_config.bootstrap_resamples, seed=model_config.split.seed)
    return {"source": source, "bayes": bayes, "window": {k: getattr(w, k) for k in ("start", "end", "measure_from", "test_from")}
            | {"train_until": w.train_until}, "main": main.name, "points": results, "variants": variants,
            "initial_models": initial, "consumers": consumers,
            "lookup_ms": latency, "seed": eval_config.vm_train.seed, "seeds": list(eval_config.seeds), "seconds": round(time.perf_counter() - t0, 1),
            "reference": training.REFERENCE, "leaking_candidates": trained.get("leaking_candidates", [])}


def consumer_tables(cfg, rows, w: ReplayWindow, fm, ae, fm_vocab, source, eval_config, main_variants,
                    log=print) -> dict:
    """Per consumer VM of the config (``[[models.consumers]]``): the coverage of its own rows by tier
    over the measured hours, and its VM variants trained and tested on its served rows (a click
    consumer of every surface is the main table itself)."""
    from experiments import replay_eval

    out = {}
    for c in cfg.models.consumers:
        mine = replay_eval.consumer_rows(cfg, rows, c, source)
        if c.task == "click" and not c.surface:
            table = {k: v for k, v in main_variants.items() if k not in ("predictions", "by_point", "fm_online_ms")}
        else:
            log(f"consumer {c.name}: VM variants on its served rows")
            table = replay_eval.evaluate(cfg, {"main": mine}, "main", w.test_from, fm, ae, fm_vocab, source,
                                         eval_config, log, same_task=c.task == "click")
            table.pop("predictions")
        out[c.name] = {"task": c.task, "surface": c.surface, "coverage": replay_eval.coverage(mine, w.measure_from),
                       **{k: table[k] for k in ("rows", "bootstrap", "fm_beats_vm", "window")}}
    return out


def main(argv: list[str] | None = None) -> int:
    from experiments.coverage_sweep import floats

    p = argparse.ArgumentParser(prog="python -m experiments.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=sorted(WINDOWS["long"]), default="synthetic")
    p.add_argument("--window", choices=sorted(WINDOWS), default="long",
                   help="long: 36+ hours of served rows for the VM variants (default); quick: a few hours")
    p.add_argument("--input", help="the log to ingest (synthetic: generated when absent)")
    from include import synthetic_world

    synthetic_world.add_arguments(p)
    add_log_arguments(p)
    p.add_argument("--sample-fraction", type=float,
                   help="replay the whole histories of this share of users (include/sample.py) instead of the whole log")
    p.add_argument("--skip-ingest", action="store_true", help="use what is already in the lake")
    p.add_argument("--start", help="first cycle (UTC, ISO, whole hour); default: the data set's window")
    p.add_argument("--end", help="requests [start, end) are replayed: cycles run at every hour from start to end")
    p.add_argument("--measure-from", help="coverage counts requests in [measure-from, end)")
    p.add_argument("--test-from", help="VM variants test on [test-from, end) and train before it")
    p.add_argument("--budgets", type=floats, default=[0.05, 0.2, 0.4])
    p.add_argument("--ttls", type=floats, default=[1.0, 6.0, 24.0], help="pair-embedding TTLs in hours")
    p.add_argument("--models", choices=MODEL_SIZES, help="FM and verifier sizes (default: [models] sizes)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--seeds", type=int, default=3,
                   help="train every VM variant with this many seeds (seed, seed + 1, ...); intervals cover them")
    p.add_argument("--reports", default="reports", help="the report goes to <reports>/replay_<source>/")
    p.add_argument("--config", help="SOLARIS TOML config")
    from include.cli import add_leak_override, with_leak_override

    add_leak_override(p)
    p.set_defaults(synthetic_hours=None)  # the window's world unless given
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.synthetic_hours is None:
        a.synthetic_hours = WORLD_HOURS[a.window]
    if a.seeds < 1:
        p.error(f"--seeds must be >= 1, got {a.seeds}")

    from include.cli import parse_time
    from include.config import load_config
    from experiments import replay_eval, replay_report
    from model import training

    base = WINDOWS[a.window][a.data]
    try:
        w = ReplayWindow(*(parse_time(getattr(a, k)) if getattr(a, k) else getattr(base, k)
                           for k in ("start", "end", "measure_from", "test_from")))
    except ValueError as e:
        p.error(str(e))
    if a.sample_fraction is not None and not 0 < a.sample_fraction <= 1:
        p.error(f"--sample-fraction must be in (0, 1], got {a.sample_fraction}")
    if a.sample_fraction is not None and a.data not in ("globo", "clicklog"):
        p.error(f"--sample-fraction applies to click logs (globo, clicklog), not to {a.data}")
    if not a.skip_ingest and not a.input and a.data != "synthetic":
        p.error(f"--input is required for --data {a.data}")
    check_log_arguments(p, a)
    cfg = with_leak_override(load_config(a.config), a)
    from include.spark import get_spark

    spark = get_spark(cfg)
    ec = training.model_set(a.models or cfg.models.sizes)
    seeded = lambda t: replace(t, seed=a.seed)  # noqa: E731
    ec = replace(ec, fm_train=seeded(ec.fm_train), vm_train=seeded(ec.vm_train), ae_train=seeded(ec.ae_train),
                 split=replace(ec.split, seed=a.seed))
    rc = replay_eval.ReplayEvalConfig(vm_train=seeded(replay_eval.ReplayEvalConfig().vm_train),
                                      seeds=tuple(range(a.seed, a.seed + a.seeds)))
    try:
        if not a.skip_ingest:
            ingest(spark, cfg, a)
        result = run(spark, cfg, a.data, w, a.budgets, a.ttls, ec, rc, log=lambda s: print(s, flush=True))
    except (FileNotFoundError, ValueError) as e:  # missing tables, empty windows: say which, no traceback
        p.exit(2, f"{p.prog}: error: {e}\n")
    out = replay_report.write(result, Path(a.reports) / f"replay_{a.data}")
    print("\n" + (out / "report.md").read_text())
    print(f"wrote {out}/report.md, result.json and {len(list(out.glob('*.png')))} plots")
    return 0


def ingest(spark, cfg, a) -> None:
    from spark_jobs.ingest import ingest as ingest_log
    from spark_jobs.ingest import write_synthetic

    path = a.input
    if a.data == "synthetic" and not path:
        from include import synthetic_world

        path = write_synthetic(cfg, wcfg=synthetic_world.from_arguments(a))
    if a.sample_fraction is not None and a.sample_fraction < 1:
        import glob

        from include import sample

        files = sorted(glob.glob(path))
        if not files:
            raise FileNotFoundError(f"--input {path!r} matches no file")
        out = cfg.lake.root_path.parent / "data" / f"{a.data}_sample_{a.sample_fraction:g}" / "clicks.csv.gz"
        rows_in, rows_out = sample.sample(files, out, a.sample_fraction, "user_id")
        print(f"sampled {rows_out:,} of {rows_in:,} clicks ({a.sample_fraction:.0%} of users) -> {out}", flush=True)
        path = str(out)
    print(f"ingesting {a.data} from {path}", flush=True)
    report = ingest_log(spark, cfg, a.data, path, log_arguments(a))
    print("\n".join(report.lines(cfg.lake.database)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
