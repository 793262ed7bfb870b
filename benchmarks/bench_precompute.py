"""Precompute runs in Spark against the same model work in one plain Python process, from 10^4 to
10^7 scored pairs.

    python benchmarks/bench_precompute.py [--lake benchmarks/out/precompute_lake] [--users 30000] [--hours 8]
        [--visits-per-hour 6000] [--reuse] [--at T] [--settings 'L,R,T;...']

    # 10^6 to 10^7 scored pairs: the whole Globo log's lake that bench_hourly_cycles.py built
    python benchmarks/bench_precompute.py --reuse --lake benchmarks/out/hourly_lake --at 2017-10-10T16:00 \
        --settings '6,25,25;24,25,25;24,50,50'
    # 10^7: 48 h look-back, 100 items each; the driver collects the baseline's inputs
    SOLARIS_CONFIG=big_driver.toml python benchmarks/bench_precompute.py --reuse --lake benchmarks/out/hourly_lake \
        --at 2017-10-10T16:00 --settings '48,100,100'
    # big_driver.toml: [spark] driver_memory = "10g", extra = { "spark.driver.maxResultSize" = "6g" }

Builds a lake with the main job (`spark_jobs.pipeline` on the synthetic impression world of
``--users`` users over ``--hours`` hours at ``--visits-per-hour``, quick models, no hourly cycles), then for each setting of
(look-back hours, recent items per user, trending items) times one whole precompute run at the
log's last hour (speculate, score with the verifier, select the budget, build the FM's inputs,
embed, MERGE, miss queue, expire, counters; `local[2]`), starting from an empty `pair_embeddings`.
The baseline is the model work of the same run in this process, on exactly the pairs that run
scored and selected: `model.inference.vm_scores` on the scored pairs and `fm_codes` on the selected
ones, whose FM inputs are collected from Spark beforehand (not timed). So the ratio is Spark's whole
run against the two model passes alone: the cost of everything Spark adds (planning, shuffles,
Python workers, Delta commits, the input joins) on top of the inference both must do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (look-back hours, recent items per user, trending items): from about 1e4 to over 1e6 scored pairs
# on the default world; the table reports what each really scored.
SETTINGS = ((1, 1, 1), (1, 10, 10), (6, 25, 25), (7, 50, 50))


def build_lake(lake: Path, users: int, hours: int, visits: float) -> None:
    shutil.rmtree(lake, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "spark_jobs.pipeline", "--synthetic-users", str(users),
                    "--synthetic-hours", str(hours), "--synthetic-visits-per-hour", str(visits), "--precompute-hours", "0", "--input", str(lake.parent / "world"),
                    "--reports", str(lake.parent / "reports")],
                   cwd=ROOT, check=True, env={**os.environ, "SOLARIS_LAKE_ROOT": str(lake)})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lake", default=str(ROOT / "benchmarks" / "out" / "precompute_lake"))
    p.add_argument("--users", type=int, default=30000)
    p.add_argument("--hours", type=int, default=8)
    p.add_argument("--visits-per-hour", type=float, default=6000)
    p.add_argument("--reuse", action="store_true", help="keep a lake built by an earlier run (any lake with models)")
    p.add_argument("--at", help="the runs' time t (default: the log's last whole hour)")
    p.add_argument("--settings", help="semicolon list of 'look-back hours,recent items per user,trending items' "
                                      f"(default: {';'.join(','.join(map(str, s)) for s in SETTINGS)})")
    a = p.parse_args(argv)
    try:
        settings = [tuple(int(x) for x in s.split(",")) for s in a.settings.split(";")] if a.settings else SETTINGS
        if any(len(s) != 3 or min(s) < 1 for s in settings):
            raise ValueError
    except ValueError:
        p.error(f"--settings must be 'L,R,T;...' of positive integers, got {a.settings!r}")
    lake = Path(a.lake).resolve()
    if not (a.reuse and (lake / "models").exists()):
        build_lake(lake, a.users, a.hours, a.visits_per_hour)

    import pandas as pd
    from pyspark.sql import functions as F

    from include.config import load_config
    from include.spark import get_spark
    from model import registry
    from model.inference import fm_codes, vm_scores
    from spark_jobs import embed_pairs, precompute

    # SOLARIS_CONFIG's settings under the benchmark's (e.g. [spark] driver_memory for 10^7 pairs)
    cfg = load_config().with_overrides(lake={"root": str(lake)}, spark={"master": "local[2]"}, models={"device": "cpu"})
    spark = get_spark(cfg)
    models = registry.resolve_models(cfg)
    fm_cfg = registry.read_json(models["fm"], "config.json")["config"]
    if a.at:
        t = datetime.fromisoformat(a.at)
        print(f"run at {t}; lake {lake}", flush=True)
    else:
        end = spark.table("solaris.request_log").agg(F.max("ts")).first()[0]
        t = end.replace(minute=0, second=0, microsecond=0)  # the log's last whole hour ends here
        print(f"run at {t}; world of {a.users} users, {a.hours} h, {a.visits_per_hour:g} visits/h", flush=True)

    precompute.run(spark, cfg, t)  # warm-up, not timed: the JVM's first jobs compile and load classes
    rows = []
    for lookback, recent, trending in settings:
        c = replace(cfg, precompute=replace(cfg.precompute, lookback_hours=lookback, recent_items_per_user=recent,
                                            trending_items=trending))
        spark.sql("DELETE FROM solaris.pair_embeddings")  # every setting starts from an empty store
        t0 = time.perf_counter()
        counters = precompute.run(spark, c, t)
        spark_s = time.perf_counter() - t0
        audit_df = spark.table("solaris.verifier_scores").where(F.col("run_id") == counters.run_id)
        audit = audit_df.toPandas()
        pairs = audit[["user_id", "item_id", "device", "surface"]].assign(ts=pd.Timestamp(t))
        t0 = time.perf_counter()
        vm_scores(pairs, models["vm"])
        score_s = time.perf_counter() - t0
        selected = audit_df.where("selected").select("user_id", "item_id", "device", "surface")
        inputs = (embed_pairs.with_fm_inputs(selected, spark.table("solaris.user_events"), spark.table("solaris.items"),
                                             t, fm_cfg["history_len"], fm_cfg["horizon_hours"])
                  .toPandas().sort_values(["user_id", "item_id"]).assign(ts=pd.Timestamp(t)))
        t0 = time.perf_counter()
        fm_codes(inputs, models["fm"], models["autoencoder"])
        embed_s = time.perf_counter() - t0
        rows.append(dict(setting=f"{lookback} h, {recent} recent, {trending} trending", scored=counters.pairs_scored,
                         embedded=counters.pairs_embedded, spark_s=spark_s, score_s=score_s, embed_s=embed_s,
                         stages=", ".join(f"{n} {s:.1f}" for n, s in counters.stage_seconds)))
        print(rows[-1], flush=True)

    print("\n| setting (look-back, items per user) | pairs scored | pairs embedded | Spark run s | plain score s "
          "| plain embed s | Spark / plain | Spark s per 10^5 scored |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        plain = r["score_s"] + r["embed_s"]
        print(f"| {r['setting']} | {r['scored']:,} | {r['embedded']:,} | {r['spark_s']:.1f} | {r['score_s']:.2f} | "
              f"{r['embed_s']:.2f} | {r['spark_s'] / plain:.1f}x | {1e5 * r['spark_s'] / r['scored']:.1f} |")
    print("\nSpark stages (s): " + " / ".join(f"{r['setting']}: {r['stages']}" for r in rows))
    print("growth: " + ", ".join(f"{b['scored'] / a_['scored']:.1f}x pairs -> {b['spark_s'] / a_['spark_s']:.1f}x time"
                                 for a_, b in zip(rows, rows[1:])))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
