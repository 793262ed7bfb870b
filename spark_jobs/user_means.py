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
from functools import reduce
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


def sum_vectors(df: DataFrame, column: str, alias: str, key: str | list[str] = "user_id",
                weight: str | None = None) -> DataFrame:
    """(key columns, alias): the element-wise sum, in doubles, of the array ``column`` per ``key``,
    each row times its ``weight`` column when one is named; pure."""
    keys = [key] if isinstance(key, str) else list(key)
    w = [F.col(weight).cast("double").alias("_w")] if weight else [F.lit(1.0).alias("_w")]
    return (df.select(*keys, F.posexplode(column).alias("pos", "value"), *w)
            .groupBy(*keys, "pos").agg(F.sum(F.col("value").cast("double") * F.col("_w")).alias("s"))
            .groupBy(*keys).agg(F.sort_array(F.collect_list(F.struct("pos", "s"))).alias("_v"))
            .select(*keys, F.transform("_v", lambda v: v["s"]).alias(alias)))


def partial_sums(pairs: DataFrame, run_id: str, t: datetime, key: str = "user_id") -> DataFrame:
    """(run_id, key, code_version, embedding_sum, pair_count, computed_at) of valid pair rows, per
    key and code space (the pairs' ``model_version``); pure."""
    keyed = pairs.withColumnRenamed("model_version", "code_version")
    keys = [key, "code_version"]
    sums = sum_vectors(keyed, "embedding", "embedding_sum", keys)
    counts = keyed.groupBy(*keys).agg(F.count(F.lit(1)).alias("pair_count"))
    return (sums.join(counts, keys).withColumn("run_id", F.lit(run_id))
            .withColumn("computed_at", F.lit(t).cast("timestamp")))


def means(sums: DataFrame, t: datetime, window_hours: float, ttl_hours: float, run_id: str, key: str = "user_id",
          half_life_hours: float | None = None, code_versions: list[str] | None = None) -> DataFrame:
    """Mean rows (key, embedding, pair_count, window_start, computed_at, expires_at, run_id,
    code_version) from the partial sums computed in [t - window, t], one per key and code space of
    ``code_versions``, each partial weighed 2^(-age / half-life) when one is given; pure. Partials of
    two code spaces are never averaged together: their codes mean different things."""
    start = t - timedelta(hours=window_hours)
    in_window = sums.where((F.col("computed_at") >= F.lit(start)) & (F.col("computed_at") <= F.lit(t))
                           & F.col("code_version").isin(list(code_versions or [])))
    if half_life_hours:
        age_hours = (F.lit(t).cast("timestamp").cast("long") - F.col("computed_at").cast("long")) / 3600.0
        weight = F.pow(F.lit(2.0), -age_hours / F.lit(float(half_life_hours)))
    else:
        weight = F.lit(1.0)
    in_window = in_window.withColumn("_weight", weight)
    keys = [key, "code_version"]
    totals = sum_vectors(in_window, "embedding_sum", "total", keys, "_weight")
    counts = in_window.groupBy(*keys).agg(F.sum("pair_count").alias("pair_count"),
                                          F.sum(F.col("pair_count") * F.col("_weight")).alias("_weighted"))
    return (totals.join(counts, keys)
            .select(key, F.transform("total", lambda s: (s / F.col("_weighted")).cast("float")).alias("embedding"),
                    "pair_count", F.lit(start).cast("timestamp").alias("window_start"),
                    F.lit(t).cast("timestamp").alias("computed_at"),
                    F.lit(t + timedelta(hours=ttl_hours)).cast("timestamp").alias("expires_at"),
                    F.lit(run_id).alias("run_id"), "code_version"))


def update(spark, cfg, kind: MeanKind, good: DataFrame, t: datetime, run_id: str, code_versions: list[str]) -> dict:
    """One kind's partials of this run, then its means at t MERGEd, then cleanup; its counters."""
    from delta.tables import DeltaTable

    db = cfg.lake.database
    sums = conform(partial_sums(good, run_id, t, kind.key), kind.sums)
    lake.replace(cfg, kind.sums, sums, f"run_id = '{run_id}'")
    start = t - timedelta(hours=kind.window_hours)
    all_sums = DeltaTable.forName(spark, qualified_name(kind.sums, db))
    rows = conform(means(all_sums.toDF(), t, kind.window_hours, kind.ttl_hours, run_id, kind.key,
                         kind.half_life_hours, code_versions), kind.means).persist()
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


def run(spark, cfg, t: datetime, dim: int | None = None, code_versions: dict[str, int] | None = None) -> dict:
    """Write the run's partial sums, then MERGE the user and item means at t, per code space; returns
    counters. ``code_versions``: the code spaces to build means of, each with its code size
    (default: those of ``model.registry.code_spaces``, the newest and in a rollout the consumers';
    ``dim`` names the size of the one code space of the models the config names)."""
    started = time.perf_counter()
    db = cfg.lake.database
    run_id = lake.run_id(t)
    mean_kinds = kinds(cfg.fallback)
    ensure_tables(spark, cfg, (PAIR_EMBEDDINGS, *(s for k in mean_kinds for s in (k.sums, k.means))))
    if code_versions is None:
        code_versions = space_sizes(cfg, dim)
    pairs = spark.table(qualified_name(PAIR_EMBEDDINGS, db)).where(F.col("run_id") == run_id)
    # valid: a finite code of its own space's size, of a space whose means are built
    good = pairs.where(reduce(lambda a, b: a | b, [(F.col("model_version") == v) & valid_embedding(d)
                                                  for v, d in code_versions.items()])).persist()
    try:
        n_pairs, n_good = pairs.count(), good.count()
        n_other = pairs.where(~F.col("model_version").isin(list(code_versions))).count()
        # rows of a code space no longer written (a promotion between precompute and this job) are
        # counted and left out, as are invalid codes
        out = {"run_id": run_id, "code_versions": ", ".join(code_versions), "pairs_of_run": n_pairs,
               "excluded_invalid": n_pairs - n_good - n_other, "excluded_other_code_version": n_other}
        for kind in mean_kinds:
            out |= update(spark, cfg, kind, good, t, run_id, list(code_versions))
    finally:
        good.unpersist()
    # the names the user-mean counters had before item means existed
    out["expired_removed"], out["old_partial_runs_removed"] = out.pop("user_means_expired_removed"), \
        out.pop("old_user_partial_runs_removed")
    return out | {"seconds": round(time.perf_counter() - started, 2)}


def space_sizes(cfg, dim: int | None = None) -> dict[str, int]:
    """{code space: code size} of the spaces whose means the hourly cycle builds."""
    from model import registry

    spaces = registry.code_spaces(cfg)
    sizes = {v: registry.autoencoder_code_dim(m["autoencoder"]) for v, m in spaces.models.items()}
    if dim is not None:
        sizes[spaces.newest] = dim
    if spaces.serving not in sizes:  # a consumers' space no longer written: its partials still average
        sizes[spaces.serving] = sizes[spaces.newest]
    return sizes


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.user_means", __doc__.split("\n\n")[0], run,
                       lambda c: print_counters("fallback means", c))


if __name__ == "__main__":
    sys.exit(main())
