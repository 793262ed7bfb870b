"""Publish the run at t: record the Delta versions of the serving tables in ``feature_versions``.

The online lookup serves the newest published snapshot, and the as-of resolution job reads the
tables at the versions published before each request (Delta time travel), so what a request
would have been served can be recomputed later, exactly.

    python -m spark_jobs.publish --at 2026-01-05T12:00:00 [--config F]   (after user_neighbors)
"""

from __future__ import annotations

import sys
from datetime import datetime

from pyspark.sql import functions as F

from feature_store.tables import (FEATURE_VERSIONS, ITEM_MEAN_EMBEDDINGS, PAIR_EMBEDDINGS, USER_MEAN_EMBEDDINGS,
                                  USER_NEIGHBORS, conform, ensure_tables, qualified_name)
from feature_store import lake
from include.cli import print_counters, run_at_time

SERVING_TABLES = (PAIR_EMBEDDINGS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS, ITEM_MEAN_EMBEDDINGS)


def run(spark, cfg, t: datetime) -> dict:
    ensure_tables(spark, cfg, (*SERVING_TABLES, FEATURE_VERSIONS))
    from model import registry

    spaces = registry.code_spaces(cfg)
    row = {"run_id": lake.run_id(t), "interval_end": t, "published_at": lake.utc_now(),  # wall clock: when, not what
           # the code space the snapshot serves (its consumers'): readers take only its rows from the
           # tables; in a rollout the new one is resolved in shadow for their next training
           "code_version": spaces.serving, "shadow_code_version": spaces.shadow}
    for spec in SERVING_TABLES:
        row[f"{spec.name}_version"] = lake.latest_version(spark, cfg, spec)
    df = conform(spark.createDataFrame([row], FEATURE_VERSIONS.schema()), FEATURE_VERSIONS)  # typed: NULLs included
    lake.upsert(spark, cfg, FEATURE_VERSIONS, df)
    return {k: v for k, v in row.items() if k != "published_at"}


def published(spark, cfg) -> list[dict]:
    """Every publication, oldest first: run_id, interval_end and the serving tables' versions."""
    ensure_tables(spark, cfg, (FEATURE_VERSIONS,))
    rows = spark.table(qualified_name(FEATURE_VERSIONS, cfg.lake.database)).orderBy("interval_end").collect()
    return [{k: v for k, v in r.asDict().items() if k != "published_at"} for r in rows]


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.publish", __doc__.split("\n\n")[0], run, lambda c: print_counters("published", c))


if __name__ == "__main__":
    sys.exit(main())
