"""The miss queue's two halves, so that its writers never conflict.

``miss_queue`` is append-only: the lookup's flusher (delta-rs, every few seconds) and the replay's
resolve job add rows and nothing rewrites them. ``miss_consumption`` records which precompute
run took each queued row in; precompute is its only writer. (Precompute once marked consumption
with a MERGE on ``miss_queue`` itself, and every lookup append that landed during the run made
that MERGE fail with a concurrent-append conflict, after the embeddings were written.)

Rows of lakes written before the split carry their run in ``miss_queue.consumed_by_run``; both
places are read.

``prune`` keeps the queue bounded: each run deletes the rows older than
``[precompute] queue_retention_hours``, with delta-rs (``lake.delete_before``): its conflict check
reads the files appended meanwhile by their statistics, so the lookup's appends of newer rows
commit beside it (Spark's DELETE on this unpartitioned table fails on any concurrent append). A
DELETE that still loses a race is tried again and otherwise left to the next run, with every row
still there.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake
from feature_store.tables import MISS_CONSUMPTION, MISS_QUEUE, conform, qualified_name

KEY = list(MISS_QUEUE.primary_key)
log = logging.getLogger("solaris.miss_queue")


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


def prune(cfg, before: datetime, attempts: int = 3) -> int:
    """Delete the queue rows requested before ``before`` and their consumption rows; returns how
    many queue rows went (0 when every attempt lost a write race: they go next run)."""
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, attempts + 1):
        try:
            n = lake.delete_before(cfg, MISS_QUEUE, "requested_at", before)
            break
        except CommitFailedError as e:
            if attempt == attempts:
                log.warning("miss_queue: rows older than %s not pruned, another writer won %d times (%s); "
                            "the next run tries again", before, attempts, str(e).splitlines()[0][:200])
                return 0
            time.sleep(0.5 * attempt)
    lake.delete_before(cfg, MISS_CONSUMPTION, "requested_at", before)  # precompute is its only writer
    return n
