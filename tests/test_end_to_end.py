"""The demo's code path and the command-line entry points, each in its own process like a user runs them."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(args, lake, timeout=1800, extra_env=None, both=False, **kw):
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "SOLARIS_SPARK_MASTER": "local[2]",
           # as with an activated virtualenv: spark-submit finds pyspark's Spark through this python
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **(extra_env or {})}
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{args} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p.stdout + p.stderr if both else p.stdout


@pytest.fixture(scope="module")
def demo_lake(tmp_path_factory):
    """The main job exactly as `make demo` runs it, on a tiny synthetic log."""
    lake = tmp_path_factory.mktemp("demo") / "lake"
    out = run([sys.executable, "-m", "spark_jobs.pipeline", "--synthetic-users", "80", "--synthetic-items", "40",
               "--synthetic-hours", "4", "--precompute-hours", "2", "--reports", str(lake.parent / "reports")], lake)
    return lake, out


def test_main_job_reports_what_landed_where(demo_lake):
    lake, out = demo_lake
    assert "[4/6] what landed where" in out
    assert "[5/6] train the FM, autoencoder and VM variants on synthetic (quick sizes)" in out
    assert "[6/6] hourly cycles" in out and out.count("precompute run 2026-01-05T") == 2
    assert out.count("publish: run_id=2026-01-05T") == 2 and "user_neighbors: " in out
    # the second cycle resolved the hour after the first publication; the coverage table follows
    assert "coverage by tier of the requests in" in out and "| all |" in out
    assert "| VM + KD (soft labels) |" in out and (lake.parent / "reports" / "model_eval_synthetic.md").exists()
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("solaris.request_log "))
    assert f"at {lake}/tables/request_log" in line
    assert "-> solaris.request_log_quarantine        0 records" in out


def test_sql_entry_point_answers_after_the_demo(demo_lake):
    lake, out = demo_lake
    requests = int(next(ln for ln in out.splitlines() if "-> solaris.request_log " in ln).split("(")[1].split()[0].replace(",", ""))
    got = run([sys.executable, "-m", "include.sql", "--json",
               "SELECT count(*) AS n, count(DISTINCT request_id) AS r, sum(label) AS clicks FROM solaris.request_log"], lake)
    row = json.loads(got.strip().splitlines()[-1])
    assert row["r"] == requests and row["clicks"] == requests and row["n"] > requests


def test_spark_submit_runs_an_ingest_job_into_the_same_catalog(demo_lake, tmp_path):
    lake, _ = demo_lake
    log = tmp_path / "more.csv"
    log.write_text("user_id,item_id,ts\nz1,i1,1767657600000\nz2,i2,1767657660000\n")
    props = run([sys.executable, "-m", "include.spark"], lake).strip()
    assert props == f"{lake}/spark-solaris.conf"
    submit = str(Path(sys.executable).with_name("spark-submit"))
    out = run([submit, "--properties-file", props, "spark_jobs/ingest_clicklog.py", "--input", str(log),
               "--source", "submitted"], lake)
    assert re.search(r"-> solaris.request_log\s+2 rows \(2 requests", out), out
    got = run([sys.executable, "-m", "include.sql", "--json",
               "SELECT source, count(*) AS n FROM solaris.ingest_runs GROUP BY source ORDER BY source"], lake)
    assert [json.loads(x) for x in got.strip().splitlines()] == [{"source": "submitted", "n": 1}, {"source": "synthetic", "n": 1}]


def test_sql_entry_point_reports_bad_sql_clearly(demo_lake):
    lake, _ = demo_lake
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "SOLARIS_SPARK_MASTER": "local[2]"}
    p = subprocess.run([sys.executable, "-m", "include.sql", "SELECT * FROM solaris.no_such_table"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "SQL error" in p.stderr and "no_such_table" in p.stderr


def test_spark_sql_cli_reads_the_same_catalog(demo_lake):
    lake, _ = demo_lake
    props = run([sys.executable, "-m", "include.spark"], lake).strip()
    spark_sql = str(Path(sys.executable).with_name("spark-sql"))
    out = run([spark_sql, "--properties-file", props, "-e",
               "SELECT count(DISTINCT request_id), sum(label) FROM solaris.request_log"], lake)
    requests, clicks = out.strip().splitlines()[-1].split("\t")
    assert int(requests) == int(clicks) > 0  # one click per request in a click log


def test_airflow_dags_test_runs_the_hourly_dag_on_the_embedded_default(demo_lake, tmp_path):
    """`airflow dags test` on SQLite runs every task of solaris_precompute for the demo's last hour
    through spark-submit on local Spark, and a rerun of the interval leaves the tables unchanged."""
    from deltalake import DeltaTable

    lake, _ = demo_lake
    home = tmp_path / "airflow"
    env = {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW_CONN_SOLARIS_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"})}
    airflow = str(Path(sys.executable).with_name("airflow"))
    run([airflow, "db", "migrate"], lake, extra_env=env)

    def tables():
        out = {}
        for name in ("pair_embeddings", "user_mean_embeddings", "user_neighbors", "request_features"):
            df = DeltaTable(str(lake / "tables" / name)).to_pandas()
            cols = [c for c in df.columns if c != "embedding"]
            out[name] = (sorted(map(tuple, df[cols].astype(str).to_numpy())),
                         sorted(tuple(map(float, e)) for e in df["embedding"]) if "embedding" in df else None)
        return out

    before = tables()
    # The run whose interval is [02:00, 03:00): the demo's last cycle, redone by the DAG's own tasks.
    out = run([airflow, "dags", "test", "solaris_precompute", "2026-01-05T03:00:00+00:00"], lake, extra_env=env, both=True)
    assert "--end 2026-01-05T03:00:00+00:00" in out  # the interval reached the Spark jobs from Airflow
    assert out.count("new_state=success") == 9 and "new_state=failed" not in out, out[-5000:]
    assert tables() == before  # the DAG redid an interval the demo had run: same rows
