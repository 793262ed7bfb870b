"""The miss queue's two halves, so that its writers never conflict.

``miss_queue`` is append-only: the lookup's flusher (delta-rs, every few seconds) and the replay's
resolve job add rows and nothing rewrites them. ``miss_consumption`` records which precompute
run took each queued row in; precompute is its only writer. (Precompute once marked consumption
with a MERGE on ``miss_queue`` itself, and every lookup append that landed during the run made
that MERGE fail with a concurrent-append conflict, after the embeddings were written.)

Rows of lakes written before the split carry their run in ``miss_queue.consumed_by_run``; both
places are read.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake
from feature_store.tables import MISS_CONSUMPTION, MISS_QUEUE, conform, qualified_name

KEY = list(MISS_QUEUE.primary_key)


def waiting(spark, db: str, before: datetime | None = None, run_id: str | None = None) -> DataFrame:
    """Queued rows (requested before ``before`` when given) that no run other than ``run_id`` took
    in: what a run at ``run_id`` takes (a rerun sees the same queue), or, without it, what waits."""
    queue = spark.table(qualified_name(MISS_QUEUE, db))
    if before is not None:
        queue = queue.where(F.col("requested_at") < F.lit(before))
    taken = spark.table(qualified_name(MISS_CONSUMPTION, db))
    legacy = F.col("consumed_by_run").isNull()
    if run_id is not None:
        taken = taken.where(F.col("consumed_by_run") != run_id)
        legacy = legacy | (F.col("consumed_by_run") == run_id)
    return queue.where(legacy).join(taken.select(*KEY), KEY, "left_anti")


def consume(spark, cfg, queue: DataFrame, pairs: DataFrame, run_id: str) -> None:
    """Record that ``run_id`` took in the rows of ``queue`` whose (user, item) is in ``pairs``. A
    MERGE that only inserts, into the table only precompute writes: a rerun records the same."""
    rows = (queue.join(pairs.select("user_id", "item_id").distinct(), ["user_id", "item_id"], "left_semi")
            .select(*KEY, F.lit(run_id).alias("consumed_by_run")).dropDuplicates(KEY))
    lake.upsert(spark, cfg, MISS_CONSUMPTION, conform(rows, MISS_CONSUMPTION), update=False)


def with_consumption(spark, db: str) -> DataFrame:
    """Every miss_queue row with the run that took it in (NULL while it waits), from either place."""
    taken = spark.table(qualified_name(MISS_CONSUMPTION, db)).withColumnRenamed("consumed_by_run", "run")
    return (spark.table(qualified_name(MISS_QUEUE, db)).join(taken, KEY, "left")
            .withColumn("consumed_by_run", F.coalesce("consumed_by_run", "run")).drop("run"))
