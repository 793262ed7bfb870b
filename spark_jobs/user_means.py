"""User means for the run at t: each user's mean pair embedding over [t - window, t].

pair_embeddings keeps only the newest row per pair and loses rows to expiry, so the mean cannot
be read back from it a day later. Instead each run adds per-user partial sums of the embeddings
it wrote (``user_embedding_sums``, one partition per run), and the mean at t is the sum of the
partials in the window over their counts: exact, and cheap (one row per user per run).

    python -m spark_jobs.user_means --at 2026-01-05T12:00:00 [--config F]   (after precompute for t)
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store.quality import valid_embedding
from feature_store.tables import (PAIR_EMBEDDINGS, USER_EMBEDDING_SUMS, USER_MEAN_EMBEDDINGS, conform,
                                  ensure_tables, qualified_name)
from feature_store import lake
from include.cli import print_counters, run_at_time


def sum_vectors(df: DataFrame, column: str, alias: str) -> DataFrame:
    """(user_id, alias): the element-wise sum, in doubles, of the array ``column`` per user; pure."""
    return (df.select("user_id", F.posexplode(column).alias("pos", "value"))
            .groupBy("user_id", "pos").agg(F.sum(F.col("value").cast("double")).alias("s"))
            .groupBy("user_id").agg(F.sort_array(F.collect_list(F.struct("pos", "s"))).alias("_v"))
            .select("user_id", F.transform("_v", lambda v: v["s"]).alias(alias)))


def partial_sums(pairs: DataFrame, run_id: str, t: datetime) -> DataFrame:
    """(run_id, user_id, embedding_sum, pair_count, computed_at) of valid pair rows; pure."""
    sums = sum_vectors(pairs, "embedding", "embedding_sum")
    counts = pairs.groupBy("user_id").agg(F.count(F.lit(1)).alias("pair_count"))
    return (sums.join(counts, "user_id").withColumn("run_id", F.lit(run_id))
            .withColumn("computed_at", F.lit(t).cast("timestamp")))


def means(sums: DataFrame, t: datetime, window_hours: int, ttl_hours: float, run_id: str) -> DataFrame:
    """user_mean_embeddings rows from the partial sums computed in [t - window, t]; pure."""
    start = t - timedelta(hours=window_hours)
    in_window = sums.where((F.col("computed_at") >= F.lit(start)) & (F.col("computed_at") <= F.lit(t)))
    totals = sum_vectors(in_window, "embedding_sum", "total")
    counts = in_window.groupBy("user_id").agg(F.sum("pair_count").alias("pair_count"))
    return (totals.join(counts, "user_id")
            .select("user_id", F.transform("total", lambda s: (s / F.col("pair_count")).cast("float")).alias("embedding"),
                    "pair_count", F.lit(start).cast("timestamp").alias("window_start"),
                    F.lit(t).cast("timestamp").alias("computed_at"),
                    F.lit(t + timedelta(hours=ttl_hours)).cast("timestamp").alias("expires_at"),
                    F.lit(run_id).alias("run_id")))


def run(spark, cfg, t: datetime, dim: int | None = None) -> dict:
    """Write the run's partial sums, then MERGE the means at t; returns counters."""
    from delta.tables import DeltaTable

    started = time.perf_counter()
    fb, db = cfg.fallback, cfg.lake.database
    run_id = lake.run_id(t)
    ensure_tables(spark, cfg, (PAIR_EMBEDDINGS, USER_EMBEDDING_SUMS, USER_MEAN_EMBEDDINGS))
    if dim is None:
        from model.registry import code_dim

        dim = code_dim(cfg)
    pairs = spark.table(qualified_name(PAIR_EMBEDDINGS, db)).where(F.col("run_id") == run_id)
    good = pairs.where(valid_embedding(dim))
    n_pairs = pairs.count()
    n_good = good.count()
    sums = conform(partial_sums(good, run_id, t), USER_EMBEDDING_SUMS)
    lake.replace(cfg, USER_EMBEDDING_SUMS, sums, f"run_id = '{run_id}'")

    start = t - timedelta(hours=fb.user_mean_window_hours)
    all_sums = DeltaTable.forName(spark, qualified_name(USER_EMBEDDING_SUMS, db))
    rows = conform(means(all_sums.toDF(), t, fb.user_mean_window_hours, fb.user_mean_ttl_hours, run_id),
                   USER_MEAN_EMBEDDINGS).persist()
    try:
        n_users = rows.count()
        lake.upsert(spark, cfg, USER_MEAN_EMBEDDINGS, rows)
    finally:
        rows.unpersist()
    # Cleanup only: readers never serve an expired mean, and partials before the window are unused.
    table = DeltaTable.forName(spark, qualified_name(USER_MEAN_EMBEDDINGS, db))
    expired = table.toDF().where(F.col("expires_at") <= F.lit(t)).count()
    if expired:
        lake.delete_expired(spark, cfg, USER_MEAN_EMBEDDINGS, t)
    old = all_sums.toDF().where(F.col("computed_at") < F.lit(start)).select("run_id").distinct().count()
    if old:
        lake.delete_where(spark, cfg, USER_EMBEDDING_SUMS, F.col("computed_at") < F.lit(start))
    return {"run_id": run_id, "pairs_of_run": n_pairs, "excluded_invalid": n_pairs - n_good,
            "users_updated": n_users, "expired_removed": expired, "old_partial_runs_removed": old,
            "seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.user_means", __doc__.split("\n\n")[0], run, lambda c: print_counters("user means", c))


if __name__ == "__main__":
    sys.exit(main())
