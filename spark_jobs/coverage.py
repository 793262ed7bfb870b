"""Coverage report for a replayed interval: the share of served candidates by tier, overall and by
user activity (the user's requests in the interval: 1, 2-4, 5-19, 20+), from ``request_features``.

    python -m spark_jobs.coverage --start 2026-01-05T06:00:00 --end 2026-01-05T12:00:00
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from feature_store import lake
from feature_store.resolution import ORDER
from feature_store.tables import (COVERAGE_REPORT, REQUEST_FEATURES, conform, ensure_tables, in_time_range,
                                  qualified_name)

BUCKETS = ("1", "2-4", "5-19", "20+")


def coverage(features: DataFrame) -> DataFrame:
    """(activity, tier, pairs, share) with every tier present in every bucket (0 when unseen); pure."""
    activity = (features.groupBy("user_id").agg(F.countDistinct("request_id").alias("n"))
                .withColumn("activity", F.when(F.col("n") == 1, "1").when(F.col("n") <= 4, "2-4")
                            .when(F.col("n") <= 19, "5-19").otherwise("20+")).select("user_id", "activity"))
    tagged = features.join(activity, "user_id")
    counts = (tagged.groupBy("activity", "tier").count()
              .unionByName(tagged.groupBy("tier").count().withColumn("activity", F.lit("all"))))
    spark = features.sparkSession
    grid = (spark.createDataFrame([(b,) for b in ("all", *BUCKETS)], "activity string")
            .crossJoin(spark.createDataFrame([(t,) for t in ORDER], "tier string")))
    present = counts.select("activity").distinct()
    return (grid.join(present, "activity").join(counts, ["activity", "tier"], "left")
            .select("activity", "tier", F.coalesce("count", F.lit(0)).alias("pairs"))
            .withColumn("share", F.col("pairs") / F.sum("pairs").over(Window.partitionBy("activity"))))


def run(spark, cfg, start: datetime, end: datetime) -> list[tuple]:
    if end <= start:
        raise ValueError(f"empty interval: end {end} is not after start {start}")
    db = cfg.lake.database
    ensure_tables(spark, cfg, (REQUEST_FEATURES, COVERAGE_REPORT))
    features = in_time_range(spark.table(qualified_name(REQUEST_FEATURES, db)), start, end)
    report_id = f"{start.isoformat()}..{end.isoformat()}"
    rows = conform(coverage(features).withColumn("report_id", F.lit(report_id))
                   .withColumn("interval_start", F.lit(start).cast("timestamp"))
                   .withColumn("interval_end", F.lit(end).cast("timestamp")), COVERAGE_REPORT)
    lake.replace(cfg, COVERAGE_REPORT, rows, f"report_id = '{report_id}'")
    out = spark.table(qualified_name(COVERAGE_REPORT, db)).where(F.col("report_id") == report_id).collect()
    order = {b: i for i, b in enumerate(("all", *BUCKETS))}
    return sorted(((r.activity, r.tier, r.pairs, r.share) for r in out),
                  key=lambda r: (order[r[0]], ORDER.index(r[1])))


def table(rows: list[tuple]) -> str:
    """Markdown: one row per activity bucket, tier shares as columns."""
    by = {}
    for activity, tier, pairs, share in rows:
        by.setdefault(activity, {})[tier] = (pairs, share)
    lines = ["| activity | pairs | " + " | ".join(ORDER) + " | exact+user_mean | all but none |",
             "|---|---:|" + "---:|" * (len(ORDER) + 2)]
    for activity, tiers in by.items():
        n = sum(p for p, _ in tiers.values())
        s = {t: tiers.get(t, (0, 0.0))[1] or 0.0 for t in ORDER}
        lines.append(f"| {activity} | {n:,} | " + " | ".join(f"{100 * s[t]:.1f}%" for t in ORDER)
                     + f" | {100 * (s['exact'] + s['user_mean']):.1f}% | {100 * (1 - s['none']):.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", required=True, help="first request time (UTC, ISO)")
    p.add_argument("--end", required=True, help="last request time (UTC, ISO), exclusive")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.config import load_config
    from include.spark import get_spark
    from include.cli import parse_time

    cfg = load_config(a.config)
    print(table(run(get_spark(cfg), cfg, parse_time(a.start), parse_time(a.end))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
