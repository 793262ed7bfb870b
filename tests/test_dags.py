"""DAG integrity: the DAG files import cleanly in a real DagBag and state what every DAG must."""

import os
from datetime import timedelta
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"solaris_precompute", "solaris_train", "solaris_backfill"}


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    old = {k: os.environ.get(k) for k in ("AIRFLOW_HOME", "AIRFLOW__CORE__LOAD_EXAMPLES")}
    os.environ.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    from airflow.dag_processing.dagbag import DagBag

    yield DagBag(dag_folder=str(ROOT / "dags"))
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_dag_files_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_every_dag_states_its_contract(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert dag.catchup is False and dag.max_active_runs == 1
    assert "solaris" in dag.tags and len(dag.tags) >= 2
    assert dag.doc_md and dag.doc_md.strip().startswith(f"### {dag_id}")
    for t in dag.tasks:
        assert t.retries >= 1, f"{dag_id}.{t.task_id} has no retries"
        assert t.execution_timeout and t.execution_timeout <= timedelta(hours=2)


def test_the_hourly_dag_runs_the_stages_in_order_on_the_hour_that_ended(dagbag):
    dag = dagbag.dags["solaris_precompute"]
    order = ["spark_properties", "validate_requests", "resolve_features", "precompute", "user_means",
             "user_neighbors", "validate_features", "publish", "publish_redis"]
    for a, b in zip(order, order[1:]):
        assert dag.get_task(b).task_id in dag.get_task(a).downstream_task_ids
    pre = dag.get_task("precompute")
    assert pre.application.endswith("spark_jobs/precompute.py")
    assert pre.application_args == ["--at", "{{ data_interval_end.isoformat() }}"]
    assert dag.get_task("resolve_features").application_args[:2] == ["--start", "{{ data_interval_start.isoformat() }}"]
    # a data-interval timetable: each run covers the hour that ended, not a zero-length trigger
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"


def test_the_tasks_that_run_the_fm_go_to_the_gpu_pool_and_queue_when_configured(tmp_path, monkeypatch):
    """``[orchestration] gpu_pool`` / ``gpu_queue``: precompute (hourly) and the backfill, the two
    tasks that run the FM, are routed there; every other task keeps the default pool."""
    config = tmp_path / "solaris.toml"
    config.write_text(f'[lake]\nroot = "{tmp_path / "lake"}"\n[orchestration]\ngpu_pool = "solaris_gpu"\ngpu_queue = "gpu"\n')
    monkeypatch.setenv("SOLARIS_CONFIG", str(config))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow_home"))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    routed = {(d, t.task_id) for d in ("solaris_precompute", "solaris_backfill") for t in bag.dags[d].tasks
              if t.pool == "solaris_gpu" and t.queue == "gpu"}
    assert routed == {("solaris_precompute", "precompute"), ("solaris_backfill", "backfill")}
    assert all(t.pool == "default_pool" for d in bag.dags.values() for t in d.tasks if (d.dag_id, t.task_id) not in routed)
