"""Fallback means for the run at t: each user's mean pair embedding and each item's decayed mean
pair embedding (across users) over [t - window, t].

pair_embeddings keeps only the newest row per pair and loses rows to expiry, so a mean cannot be
read back from it a day later. Instead each run adds partial sums of the embeddings it wrote, per
user (``user_embedding_sums``) and per item (``item_embedding_sums``), one partition per run; the
mean at t is the sum of the partials in the window over their counts: exact, and cheap (one row
per user or item per run). The user mean weighs every run alike; the item mean weighs a run's
partial by 2^(-age / half-life), so it follows what the FM says of the item now (its freshness,
its recent clicks), not a day ago.

    python -m spark_jobs.user_means --at 2026-01-05T12:00:00 [--config F]   (after precompute for t)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store.quality import valid_embedding
from feature_store.tables import (ITEM_EMBEDDING_SUMS, ITEM_MEAN_EMBEDDINGS, PAIR_EMBEDDINGS, USER_EMBEDDING_SUMS,
                                  USER_MEAN_EMBEDDINGS, TableSpec, conform, ensure_tables, qualified_name)
from feature_store import lake
from include.cli import print_counters, run_at_time


@dataclass(frozen=True)
class MeanKind:
    """One fallback mean: its key column, its tables and its window, decay and TTL."""

    key: str
    sums: TableSpec
    means: TableSpec
    window_hours: float
    ttl_hours: float
    half_life_hours: float | None = None  # None: every run in the window weighs the same


def kinds(fb) -> tuple[MeanKind, MeanKind]:
    return (MeanKind("user_id", USER_EMBEDDING_SUMS, USER_MEAN_EMBEDDINGS, fb.user_mean_window_hours,
                     fb.user_mean_ttl_hours),
            MeanKind("item_id", ITEM_EMBEDDING_SUMS, ITEM_MEAN_EMBEDDINGS, fb.item_mean_window_hours,
                     fb.item_mean_ttl_hours, fb.item_mean_half_life_hours))


def sum_vectors(df: DataFrame, column: str, alias: str, key: str = "user_id", weight: str | None = None) -> DataFrame:
    """(key, alias): the element-wise sum, in doubles, of the array ``column`` per ``key``, each row
    times its ``weight`` column when one is named; pure."""
    w = [F.col(weight).cast("double").alias("_w")] if weight else [F.lit(1.0).alias("_w")]
    return (df.select(key, F.posexplode(column).alias("pos", "value"), *w)
            .groupBy(key, "pos").agg(F.sum(F.col("value").cast("double") * F.col("_w")).alias("s"))
            .groupBy(key).agg(F.sort_array(F.collect_list(F.struct("pos", "s"))).alias("_v"))
            .select(key, F.transform("_v", lambda v: v["s"]).alias(alias)))


def partial_sums(pairs: DataFrame, run_id: str, t: datetime, key: str = "user_id") -> DataFrame:
    """(run_id, key, embedding_sum, pair_count, computed_at) of valid pair rows; pure."""
    sums = sum_vectors(pairs, "embedding", "embedding_sum", key)
    counts = pairs.groupBy(key).agg(F.count(F.lit(1)).alias("pair_count"))
    return (sums.join(counts, key).withColumn("run_id", F.lit(run_id))
            .withColumn("computed_at", F.lit(t).cast("timestamp")))


def means(sums: DataFrame, t: datetime, window_hours: float, ttl_hours: float, run_id: str, key: str = "user_id",
          half_life_hours: float | None = None) -> DataFrame:
    """Mean rows (key, embedding, pair_count, window_start, computed_at, expires_at, run_id) from the
    partial sums computed in [t - window, t], each weighed 2^(-age / half-life) when one is given; pure."""
    start = t - timedelta(hours=window_hours)
    in_window = sums.where((F.col("computed_at") >= F.lit(start)) & (F.col("computed_at") <= F.lit(t)))
    if half_life_hours:
        age_hours = (F.lit(t).cast("timestamp").cast("long") - F.col("computed_at").cast("long")) / 3600.0
        weight = F.pow(F.lit(2.0), -age_hours / F.lit(float(half_life_hours)))
    else:
        weight = F.lit(1.0)
    in_window = in_window.withColumn("_weight", weight)
    totals = sum_vectors(in_window, "embedding_sum", "total", key, "_weight")
    counts = in_window.groupBy(key).agg(F.sum("pair_count").alias("pair_count"),
                                        F.sum(F.col("pair_count") * F.col("_weight")).alias("_weighted"))
    return (totals.join(counts, key)
            .select(key, F.transform("total", lambda s: (s / F.col("_weighted")).cast("float")).alias("embedding"),
                    "pair_count", F.lit(start).cast("timestamp").alias("window_start"),
                    F.lit(t).cast("timestamp").alias("computed_at"),
                    F.lit(t + timedelta(hours=ttl_hours)).cast("timestamp").alias("expires_at"),
                    F.lit(run_id).alias("run_id")))


def update(spark, cfg, kind: MeanKind, good: DataFrame, t: datetime, run_id: str) -> dict:
    """One kind's partials of this run, then its means at t MERGEd, then cleanup; its counters."""
    from delta.tables import DeltaTable

    db = cfg.lake.database
    sums = conform(partial_sums(good, run_id, t, kind.key), kind.sums)
    lake.replace(cfg, kind.sums, sums, f"run_id = '{run_id}'")
    start = t - timedelta(hours=kind.window_hours)
    all_sums = DeltaTable.forName(spark, qualified_name(kind.sums, db))
    rows = conform(means(all_sums.toDF(), t, kind.window_hours, kind.ttl_hours, run_id, kind.key,
                         kind.half_life_hours), kind.means).persist()
    try:
        n = rows.count()
        lake.upsert(spark, cfg, kind.means, rows)
    finally:
        rows.unpersist()
    # Cleanup only: readers never serve an expired mean, and partials before the window are unused.
    table = DeltaTable.forName(spark, qualified_name(kind.means, db))
    expired = table.toDF().where(F.col("expires_at") <= F.lit(t)).count()
    if expired:
        lake.delete_expired(spark, cfg, kind.means, t)
    old = all_sums.toDF().where(F.col("computed_at") < F.lit(start)).select("run_id").distinct().count()
    if old:
        lake.delete_where(spark, cfg, kind.sums, F.col("computed_at") < F.lit(start))
    noun = kind.key.removesuffix("_id")
    return {f"{noun}s_updated": n, f"{noun}_means_expired_removed": expired, f"old_{noun}_partial_runs_removed": old}


def run(spark, cfg, t: datetime, dim: int | None = None) -> dict:
    """Write the run's partial sums, then MERGE the user and item means at t; returns counters."""
    started = time.perf_counter()
    db = cfg.lake.database
    run_id = lake.run_id(t)
    mean_kinds = kinds(cfg.fallback)
    ensure_tables(spark, cfg, (PAIR_EMBEDDINGS, *(s for k in mean_kinds for s in (k.sums, k.means))))
    if dim is None:
        from model.registry import code_dim

        dim = code_dim(cfg)
    pairs = spark.table(qualified_name(PAIR_EMBEDDINGS, db)).where(F.col("run_id") == run_id)
    good = pairs.where(valid_embedding(dim)).persist()
    try:
        n_pairs = pairs.count()
        n_good = good.count()
        out = {"run_id": run_id, "pairs_of_run": n_pairs, "excluded_invalid": n_pairs - n_good}
        for kind in mean_kinds:
            out |= update(spark, cfg, kind, good, t, run_id)
    finally:
        good.unpersist()
    # the names the user-mean counters had before item means existed
    out["expired_removed"], out["old_partial_runs_removed"] = out.pop("user_means_expired_removed"), \
        out.pop("old_user_partial_runs_removed")
    return out | {"seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.user_means", __doc__.split("\n\n")[0], run,
                       lambda c: print_counters("fallback means", c))


if __name__ == "__main__":
    sys.exit(main())
