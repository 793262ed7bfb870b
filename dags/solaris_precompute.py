"""
### solaris_precompute (hourly)

One SOLARIS cycle for the hour that just ended, `[data_interval_start, data_interval_end)`, with
t = `data_interval_end`:

1. **validate_requests**: great-expectations on the hour's `request_log` rows;
2. **resolve_features**: the hour's candidates get the embedding and tier served at their
   timestamps (snapshots published before t) -> `request_features`;
3. **precompute**: speculate, score with the verifier VM, select the budget, embed with the FM,
   MERGE into `pair_embeddings` with expiry, take in `miss_queue`, expire (and vacuum on its cadence);
4. **user_means** (the fallback means) -> `user_mean_embeddings`, `item_mean_embeddings`; 5. **user_neighbors** (FAISS) -> `user_neighbors`;
6. **validate_features**: embedding size, no NaN, expiry after computation, coverage floor;
7. **publish**: the serving tables' versions -> `feature_versions` (the online lookup reloads);
8. **publish_redis**: the snapshot to Redis when `SOLARIS_REDIS_URL` is set.

Each Spark stage is one `spark-submit` of a `spark_jobs/` entry point through the `solaris_spark`
connection. Every stage is idempotent for its interval: clearing and rerunning a run rewrites the
same rows. `max_active_runs=1`: runs write the same tables, in order.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task

from include.orchestration import DEFAULT_ARGS, END, START, gpu_routing, spark_job, write_spark_properties


@task(task_id="publish_redis")
def publish_redis() -> str:
    from lookup.redis_store import publish_task

    return publish_task()


@dag(
    dag_id="solaris_precompute",
    # A data-interval timetable: each run covers [previous hour, this hour); "@hourly" alone would
    # give Airflow 3's zero-length trigger intervals.
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,  # backfills go through solaris_backfill, one Spark application for the whole range
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["solaris", "precompute", "hourly"],
    doc_md=__doc__,
)
def solaris_precompute():
    spark_properties = task(write_spark_properties, task_id="spark_properties")()
    stages = [
        spark_job("validate_requests", "validate", "requests", "--start", START, "--end", END),
        spark_job("resolve_features", "resolve_features", "--start", START, "--end", END),
        spark_job("precompute", "precompute", "--at", END, **gpu_routing()),  # the FM runs here
        spark_job("user_means", "user_means", "--at", END),
        spark_job("user_neighbors", "user_neighbors", "--at", END),
        spark_job("validate_features", "validate", "features", "--at", END),
        spark_job("publish", "publish", "--at", END),
        publish_redis(),
    ]
    prev = spark_properties
    for stage in stages:
        prev >> stage
        prev = stage


solaris_precompute()
