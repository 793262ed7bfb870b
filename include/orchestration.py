"""What the DAG files share: the project's paths, default task arguments, and one factory for a
SparkSubmitOperator that runs a ``spark_jobs/`` entry point with the run's interval as templated
arguments. Only light imports at module top: the scheduler parses DAG files constantly.

The Spark connection (``solaris_spark`` unless ``SOLARIS_SPARK_CONN_ID`` says otherwise) sets
the master: ``local[*]`` on the embedded default, ``spark://host:7077`` (or yarn, k8s) on a
cluster. Everything else Spark needs comes from the properties file the ``spark_properties``
task writes from the SOLARIS config (include/spark.py).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPARK_CONN_ID = os.environ.get("SOLARIS_SPARK_CONN_ID", "solaris_spark")
# The interval of the run, as the jobs take it (ISO, UTC): [START, END); END is the run's time t.
START = "{{ data_interval_start.isoformat() }}"
END = "{{ data_interval_end.isoformat() }}"


def default_args() -> dict:
    """Every task's retries and timeout, from the SOLARIS config's ``[orchestration]``."""
    from include.config import load_config

    o = load_config().orchestration
    return {"owner": "solaris", "retries": o.retries, "retry_delay": timedelta(seconds=o.retry_delay_seconds),
            "execution_timeout": timedelta(hours=o.execution_timeout_hours)}


DEFAULT_ARGS = default_args()


def gpu_routing() -> dict:
    """The pool and queue of the tasks that run the FM (``[orchestration] gpu_pool``, ``gpu_queue``),
    as SparkSubmitOperator arguments; nothing where they are not set."""
    from include.config import load_config

    o = load_config().orchestration
    return {k: v for k, v in (("pool", o.gpu_pool), ("queue", o.gpu_queue)) if v}


def properties_file() -> str:
    """Where the ``spark_properties`` task writes the Spark settings (beside the lake)."""
    from include.config import load_config

    return str(load_config().lake.root_path / "spark-solaris.conf")


def write_spark_properties() -> str:
    """Task body: write the properties file from the current config; returns its path."""
    from include.config import load_config
    from include.spark import write_properties

    return str(write_properties(load_config(), Path(properties_file())))


def spark_job(task_id: str, job: str, *args: str, **kwargs):
    """A SparkSubmitOperator running ``spark_jobs/<job>.py args`` through the Spark connection."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        task_id=task_id,
        application=str(ROOT / "spark_jobs" / f"{job}.py"),
        application_args=list(args),
        conn_id=SPARK_CONN_ID,
        properties_file=properties_file(),
        spark_binary=str(Path(sys.executable).with_name("spark-submit")),
        name=f"solaris-{task_id}",
        **kwargs,
    )
