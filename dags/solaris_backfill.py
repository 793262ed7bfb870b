"""
### solaris_backfill (manual)

The hourly cycle over a range of interval ends, in order, in one Spark application
(`spark_jobs/backfill.py`): trigger with params `start` and `end` (UTC, ISO; the half-open range
[start, end) of request time, so the cycles run at every hour end in (start, end]) and
optionally `stages` (default all: resolve, precompute, user_means, user_neighbors, publish).
Each interval is idempotent, so a failed backfill is rerun over the same range. For very large
ranges the same command runs with `spark-submit --master spark://...` on a cluster.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from include.orchestration import DEFAULT_ARGS, gpu_routing, spark_job, write_spark_properties


@task(task_id="publish_redis")
def publish_redis() -> str:
    from lookup.redis_store import publish_task

    return publish_task()


@dag(
    dag_id="solaris_backfill",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # writes the same tables as the hourly runs
    default_args={**DEFAULT_ARGS, "retries": 1},  # intervals are idempotent: a retry redoes the range safely
    tags=["solaris", "backfill", "manual"],
    doc_md=__doc__,
    params={
        "start": Param("2026-01-05T00:00:00", type="string", description="first request time, UTC ISO, inclusive"),
        "end": Param("2026-01-05T03:00:00", type="string", description="last request time, UTC ISO, exclusive"),
        "stages": Param("resolve,precompute,user_means,user_neighbors,publish", type="string"),
    },
)
def solaris_backfill():
    spark_properties = task(write_spark_properties, task_id="spark_properties")()
    backfill = spark_job("backfill", "backfill", "--start", "{{ params.start }}", "--end", "{{ params.end }}",
                         "--stages", "{{ params.stages }}", **gpu_routing())
    spark_properties >> backfill >> publish_redis()


solaris_backfill()
