"""Publish the run at t: record the Delta versions of the serving tables in ``feature_versions``.

The online lookup serves the newest published snapshot, and the as-of resolution job reads the
tables at the versions published before each request (Delta time travel), so what a request
would have been served can be recomputed later, exactly.

    python -m spark_jobs.publish --end 2026-01-05T12:00:00 [--config F]   (after user_neighbors)
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from pyspark.sql import functions as F

from feature_store.tables import (FEATURE_VERSIONS, PAIR_EMBEDDINGS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS, conform,
                                  ensure_tables, qualified_name)

SERVING_TABLES = (PAIR_EMBEDDINGS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS)


def run(spark, cfg, t: datetime) -> dict:
    from delta.tables import DeltaTable

    db = cfg.lake.database
    ensure_tables(spark, cfg, (*SERVING_TABLES, FEATURE_VERSIONS))
    row = {"run_id": t.isoformat(timespec="seconds"), "interval_end": t,
           "published_at": datetime.now(timezone.utc).replace(tzinfo=None)}  # wall clock: when, not what
    for spec in SERVING_TABLES:
        row[f"{spec.name}_version"] = DeltaTable.forName(spark, qualified_name(spec, db)).history(1).first()["version"]
    df = conform(spark.createDataFrame([row]).withColumn("interval_end", F.col("interval_end").cast("timestamp")),
                 FEATURE_VERSIONS)
    (DeltaTable.forName(spark, qualified_name(FEATURE_VERSIONS, db)).alias("t")
     .merge(df.alias("s"), "t.run_id = s.run_id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    return {k: v for k, v in row.items() if k != "published_at"}


def published(spark, cfg) -> list[dict]:
    """Every publication, oldest first: run_id, interval_end and the three versions."""
    ensure_tables(spark, cfg, (FEATURE_VERSIONS,))
    rows = spark.table(qualified_name(FEATURE_VERSIONS, cfg.lake.database)).orderBy("interval_end").collect()
    return [{k: v for k, v in r.asDict().items() if k != "published_at"} for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="publish", description=__doc__.split("\n\n")[0])
    p.add_argument("--end", required=True, help="the run's time t (UTC, ISO)")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.config import load_config
    from include.spark import get_spark
    from spark_jobs.precompute import parse_time
    from spark_jobs.user_means import print_counters

    cfg = load_config(a.config)
    print_counters("published", run(get_spark(cfg), cfg, parse_time(a.end)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
