"""Precompute throughput: Spark (local[2]) against the same models in one plain Python process.

    python benchmarks/bench_precompute.py [--lake benchmarks/out/precompute_lake] [--hours 24]

Generates a synthetic log, ingests it, trains quick models, then for look-back windows of 1x, 2x
and 4x the base interval it times one precompute run (speculate + score + select + embed + MERGE)
and, on exactly the pairs that run scored and embedded, the plain-Python baseline
(model.inference.vm_scores / fm_codes on pandas frames in this process). Prints pairs scored/s and
embedded/s for both, the Spark/plain ratio, how run time grows with the window, and the FM
inferences saved against embedding every candidate pair.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lake", default=str(ROOT / "benchmarks" / "out" / "precompute_lake"))
    p.add_argument("--hours", type=int, default=24, help="hours of synthetic traffic")
    p.add_argument("--base-window", type=int, default=1, help="base look-back hours (1x)")
    a = p.parse_args(argv)

    import pandas as pd
    from pyspark.sql import functions as F

    from include import synthetic
    from include.config import SolarisConfig
    from include.spark import get_spark
    from model import registry, training
    from model.inference import fm_codes, vm_scores
    from spark_jobs import ingest_clicklog as ic
    from spark_jobs import precompute

    shutil.rmtree(a.lake, ignore_errors=True)
    cfg = SolarisConfig().with_overrides(lake={"root": a.lake}, spark={"master": "local[2]"},
                                         models={"device": "cpu"})
    spark = get_spark(cfg)
    scfg = synthetic.SyntheticConfig(hours=a.hours)
    log = Path(a.lake).parent / "precompute_clicks.csv"
    synthetic.write_csv(synthetic.generate(scfg), log)
    ic.ingest(spark, cfg, str(log), ic.spec_from_args(ic.parse_args(["--input", str(log), "--source", "synthetic"]), cfg))
    training.train_all(cfg, "synthetic", training.QUICK, log=lambda *_: None)
    models = registry.resolve_models(cfg)
    end = datetime.fromisoformat(scfg.start) + timedelta(hours=a.hours)

    rows = []
    for mult in (1, 2, 4):
        w = a.base_window * mult
        c = replace(cfg, precompute=replace(cfg.precompute, lookback_hours=w))
        t = end - timedelta(hours=1)
        spark.sql("DELETE FROM solaris.pair_embeddings")  # every window starts from an empty store
        t0 = time.perf_counter()
        counters = precompute.run(spark, c, t)
        spark_s = time.perf_counter() - t0
        audit = spark.table("solaris.verifier_scores").where(F.col("run_id") == counters.run_id).toPandas()
        pairs = audit[["user_id", "item_id", "device", "surface"]].assign(ts=pd.Timestamp(t))
        t0 = time.perf_counter()
        vm_scores(pairs, models["vm"])
        score_s = time.perf_counter() - t0
        sel = pairs[audit["selected"].to_numpy()]
        hist = (spark.table("solaris.user_events").where(F.col("ts") < F.lit(t)).toPandas()
                .sort_values("ts").groupby("user_id")["item_id"].agg(list))
        sel = sel.assign(history=sel["user_id"].map(hist))
        t0 = time.perf_counter()
        fm_codes(sel, models["fm"], models["autoencoder"])
        embed_s = time.perf_counter() - t0
        rows.append(dict(window_h=w, scored=counters.pairs_scored, embedded=counters.pairs_embedded,
                         spark_s=spark_s, plain_s=score_s + embed_s,
                         plain_scored_per_s=len(pairs) / score_s, plain_embedded_per_s=len(sel) / embed_s))
        print(rows[-1], flush=True)

    print("\n| look-back | pairs scored | pairs embedded | Spark run s | pairs scored/s (Spark, whole run) | "
          "plain Python s (score + embed) | plain scored/s | plain embedded/s | Spark/plain time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['window_h']} h | {r['scored']:,} | {r['embedded']:,} | {r['spark_s']:.1f} | "
              f"{r['scored'] / r['spark_s']:,.0f} | {r['plain_s']:.2f} | {r['plain_scored_per_s']:,.0f} | "
              f"{r['plain_embedded_per_s']:,.0f} | {r['spark_s'] / r['plain_s']:.1f}x |")
    base = rows[0]
    print("\ngrowth with the window: " + ", ".join(
        f"{r['window_h']} h: {r['scored'] / base['scored']:.1f}x pairs, {r['spark_s'] / base['spark_s']:.1f}x time"
        for r in rows))
    print("FM inferences saved vs embedding every scored candidate: " + ", ".join(
        f"{r['window_h']} h: {100 * (1 - r['embedded'] / r['scored']):.0f}%" for r in rows))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
