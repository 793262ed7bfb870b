"""The demo's code path and the command-line entry points, each in its own process like a user runs them."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import maven_jars
from tests.conftest import run
from tests.maven_jars import DERBY

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.spark]


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


def test_the_demo_console_is_the_jobs_own_lines(demo_lake):
    """What a person reads: the job's stages and results, Spark's errors only (its warnings with
    --verbose), no progress bars, no Ivy report once the Delta jars are known; two screens."""
    _, out = demo_lake
    lines = out.splitlines()
    assert not [ln for ln in lines if re.match(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN ", ln)], out[-3000:]
    assert "Calculating Metrics" not in out and "it/s]" not in out
    assert ":: resolving dependencies ::" not in out and "confs: [default]" not in out
    assert len(lines) <= 120, f"{len(lines)} lines:\n{out}"  # two screens


def test_sql_entry_point_answers_after_the_demo(demo_lake, sql_answers):
    lake, out = demo_lake
    requests = int(next(ln for ln in out.splitlines() if "-> solaris.request_log " in ln).split("(")[1].split()[0].replace(",", ""))
    row = sql_answers["count"][0]
    log = delta_table(lake, "request_log")  # read independently, with delta-rs
    assert row["r"] == requests == log["request_id"].nunique() and row["n"] == len(log) > requests
    assert row["clicks"] == int(log["label"].sum()) > 0


def test_spark_submit_ingests_into_a_copied_lake_and_never_into_the_original(demo_lake, tmp_path):
    """`cp -r lake lake2` copies the embedded metastore, whose entries hold the original's absolute
    paths. A job on the copy re-points them (and says so), then reads and writes only the copy."""
    import shutil

    from deltalake import DeltaTable

    lake, _ = demo_lake
    read = lambda root, name: DeltaTable(str(root / "tables" / name)).to_pandas()  # noqa: E731
    before = {n: read(lake, n) for n in ("request_log", "ingest_runs", "user_events")}
    copy = tmp_path / "lake2"
    shutil.copytree(lake, copy)
    log = tmp_path / "more.csv"
    log.write_text("user_id,item_id,ts\nz1,i1,1767657600000\nz2,i2,1767657660000\n")
    props = run([sys.executable, "-m", "include.spark"], copy).strip()
    assert props == f"{copy}/spark-solaris.conf"
    submit = str(Path(sys.executable).with_name("spark-submit"))
    out = run([submit, "--properties-file", props, "spark_jobs/ingest_clicklog.py", "--input", str(log),
               "--source", "submitted"], copy, both=True)
    # two clicks, two requests; the first has the second's item as its negative (the clicks that follow)
    assert re.search(r"-> solaris.request_log\s+3 rows \(2 requests", out), out
    assert f"note: the catalog of {copy} pointed into {lake} (a copied or moved lake): " in out
    got = run([sys.executable, "-m", "include.sql", "--json",
               "SELECT source, count(*) AS n FROM solaris.ingest_runs GROUP BY source ORDER BY source"], copy)
    assert [json.loads(x) for x in got.strip().splitlines()] == [{"source": "submitted", "n": 1}, {"source": "synthetic", "n": 1}]
    assert sorted(read(copy, "ingest_runs")["source"]) == ["submitted", "synthetic"]
    for name, df in before.items():  # the original lake, read by path: exactly as it was
        pd_cols = [c for c in df.columns if c != "embedding"]
        assert read(lake, name)[pd_cols].sort_values(pd_cols).reset_index(drop=True).equals(
            df[pd_cols].sort_values(pd_cols).reset_index(drop=True)), name


def test_sql_entry_point_reports_bad_sql_clearly(demo_lake):
    lake, _ = demo_lake
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "SOLARIS_SPARK_MASTER": "local[2]"}
    p = subprocess.run([sys.executable, "-m", "include.sql", "SELECT * FROM solaris.no_such_table"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "SQL error" in p.stderr and "no_such_table" in p.stderr


def test_spark_sql_cli_reads_the_same_catalog(demo_lake, spark_sql_out):
    requests, clicks = spark_sql_out.strip().splitlines()[-1].split("\t")
    log = delta_table(demo_lake[0], "request_log")
    assert (int(requests), int(clicks)) == (log["request_id"].nunique(), int(log["label"].sum()))
    assert 0 < int(clicks) < len(log)  # an impression log: most shown items are not clicked


def delta_table(lake, name):
    from deltalake import DeltaTable

    return DeltaTable(str(lake / "tables" / name)).to_pandas()


def sections(out: str) -> list[list[dict]]:
    """The rows of each statement of an ``include.sql --file --json`` run, in file order."""
    got = []
    for line in out.splitlines():
        if line.startswith("-- "):
            got.append([])
        elif line.startswith("{"):
            got[-1].append(json.loads(line))
    return got


QUERIES = ROOT / "docs" / "example_queries.sql"
COUNT = "SELECT count(*) AS n, count(DISTINCT request_id) AS r, sum(label) AS clicks FROM solaris.request_log"
CLI_COUNT = "SELECT count(DISTINCT request_id), sum(label) FROM solaris.request_log"


@pytest.fixture(scope="module")
def sql_answers(demo_lake, tmp_path_factory):
    """One run of the SQL entry point (one JVM) over docs/example_queries.sql, the same file with a
    6-hour horizon (so the expiry query also has rows to count: the TTL is 6 h), and a count."""
    lake, _ = demo_lake
    text = QUERIES.read_text()
    both = tmp_path_factory.mktemp("sql") / "all.sql"
    both.write_text(f"{text}\n{text.replace('INTERVAL 1 HOUR', 'INTERVAL 6 HOURS')}\n{COUNT};\n")
    got = sections(run([sys.executable, "-m", "include.sql", "--json", "--file", str(both)], lake))
    assert len(got) == 9
    return {"queries": got[:4], "wider": got[4:8], "count": got[8]}


@pytest.fixture(scope="module")
def spark_sql_out(demo_lake, tmp_path_factory):
    """spark-sql -f over the example queries and a count, on the properties file of the lake."""
    lake, _ = demo_lake
    path = tmp_path_factory.mktemp("spark_sql") / "queries.sql"
    path.write_text(f"{QUERIES.read_text()}\n{CLI_COUNT};\n")
    props = run([sys.executable, "-m", "include.spark"], lake).strip()
    spark_sql = str(Path(sys.executable).with_name("spark-sql"))
    return run([spark_sql, "--properties-file", props, "-f", str(path)], lake)


def test_documented_example_queries_answer_what_the_tables_hold(demo_lake, sql_answers, spark_sql_out):
    """docs/example_queries.sql through the SQL entry point and spark-sql, against the tables read
    independently with delta-rs."""
    import pandas as pd
    from deltalake import DeltaTable

    lake, _ = demo_lake
    read = lambda name: DeltaTable(str(lake / "tables" / name)).to_pandas()
    got, got_wide = sql_answers["queries"], sql_answers["wider"]
    assert len(got) == len(got_wide) == 4

    feats, pairs, runs = read("request_features"), read("pair_embeddings"), read("precompute_runs")
    day = feats[feats["date"] == feats["date"].max()]
    want = day.groupby("tier").size()
    assert [(r["tier"], r["candidates"]) for r in got[0]] == sorted(want.items())
    assert sum(r["share"] for r in got[0]) == pytest.approx(1.0, abs=1e-3) and len(want) >= 2

    t = runs["interval_end"].max()
    for rows, hours in ((got[1], 1), (got_wide[1], 6)):
        expiring = pairs[(pairs["expires_at"] > t) & (pairs["expires_at"] <= t + pd.Timedelta(hours=hours))]
        assert rows[0]["expiring_pairs"] == len(expiring)
    assert got_wide[1][0]["expiring_pairs"] > 0

    valid = pairs[pairs["expires_at"] > t].groupby("user_id").size().reset_index(name="n")
    top = valid.sort_values(["n", "user_id"], ascending=[False, True]).head(10)
    assert [(r["user_id"], r["pairs"]) for r in got[2]] == list(zip(top["user_id"], top["n"]))

    newest = runs.sort_values("interval_end").iloc[-1]
    assert got[3][0]["run_id"] == newest["run_id"] and got[3][0]["pairs_embedded"] == newest["pairs_embedded"]

    out = spark_sql_out
    assert f"{top['user_id'].iloc[0]}\t{top['n'].iloc[0]}\t" in out and newest["run_id"] in out


def test_a_second_driver_on_the_embedded_metastore_stops_at_once_with_one_line(spark, lake_root):
    """The test session's JVM holds its lake's Derby metastore: a job started on the same lake ends
    at once with one clear line, not after minutes of retries and thousands of log lines."""
    import subprocess
    import time

    started = time.time()
    p = subprocess.run([sys.executable, "-m", "spark_jobs.precompute", "--at", "2026-01-05T03:00:00"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SOLARIS_LAKE_ROOT": str(lake_root), "SOLARIS_SPARK_MASTER": "local[1]"})
    assert p.returncode != 0 and "is in use by another Spark driver" in p.stderr, p.stderr[-2000:]
    assert len(p.stderr.splitlines()) < 5 and time.time() - started < 120


def test_two_drivers_started_in_the_same_second_one_runs_and_one_stops_at_once(tmp_path):
    """Both start on a fresh lake before either's Derby has booted: the driver lock taken before
    the JVM starts lets one through and stops the other with one line, not after minutes."""
    import subprocess
    import time

    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(tmp_path / "lake"), "SOLARIS_SPARK_MASTER": "local[1]"}
    started = time.time()
    runs = [subprocess.Popen([sys.executable, "-m", "include.sql", "SHOW DATABASES"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    out = [(p.wait(300), p.stderr.read()) for p in runs]
    codes = sorted(code for code, _ in out)
    refused = next(err for code, err in out if code != 0)
    assert codes[0] == 0 and codes[1] != 0 and "is in use by another Spark driver" in refused, out
    assert len(refused.splitlines()) < 5 and time.time() - started < 240


def fetched_jar(artifact: str) -> Path:
    """A jar that `make test` fetched before the suite (tests/maven_jars.py)."""
    path = maven_jars.jar(artifact)
    assert path.is_file(), f"{path} is missing: `make test` fetches it (python -m tests.maven_jars)"
    return path


@pytest.fixture
def shared_metastore(tmp_path):
    """A Derby network server on 127.0.0.1: a Hive metastore that many Spark drivers share, as a
    cluster's is. Yields the [spark.extra] settings that point a job at it."""
    import pyspark

    from tests.conftest import free_port

    jars = Path(pyspark.__file__).parent / "jars"
    classpath = [jars / f"{a}-{DERBY}.jar" for a in ("derby", "derbyshared", "derbytools")]
    classpath.append(fetched_jar("derbynet"))
    client = fetched_jar("derbyclient")
    port = free_port()
    server = subprocess.Popen(["java", "-cp", ":".join(map(str, classpath)), f"-Dderby.system.home={tmp_path}",
                               "org.apache.derby.drda.NetworkServerControl", "start", "-h", "127.0.0.1", "-p",
                               str(port), "-noSecurityManager"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        line = server.stdout.readline()
        assert "started and ready to accept connections" in line, line
        yield {"spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby://127.0.0.1:{port}/metastore;create=true",
               "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.ClientDriver",
               "spark.driver.extraClassPath": str(client)}
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def _finish(p, everyone, timeout):
    """``p.communicate()``; a driver still running after ``timeout`` (a run takes about a minute)
    fails the test with its log and its JVM's thread dump, instead of waiting out the test's limit."""
    import psutil

    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = []
        for child in psutil.Process(p.pid).children(recursive=True):
            if child.name() == "java":
                try:
                    stacks.append(subprocess.run(["jstack", str(child.pid)], capture_output=True, text=True,
                                                 timeout=60).stdout)
                except (OSError, subprocess.TimeoutExpired) as e:
                    stacks.append(f"(no thread dump of {child.pid}: {e})")
        for q in everyone:
            for child in psutil.Process(q.pid).children(recursive=True) if q.poll() is None else ():
                child.kill()
            q.kill()
        _, err = p.communicate()
        raise AssertionError(f"precompute driver {p.pid} still running after {timeout} s\n--- its log\n{err[-4000:]}"
                             f"\n--- its JVM's threads\n{''.join(stacks)[-12000:]}")


def test_two_runs_of_one_hour_at_once_on_a_shared_metastore_leave_one_whole_result(demo_lake, shared_metastore, tmp_path):
    """Two precompute drivers for the same hour at once, on a shared Hive metastore (Derby's network
    server here; PostgreSQL or MySQL on a cluster), with the catalog's tables not registered yet:
    both register them (the loser of that race takes the winner's table), then race on the Delta
    commits. A run that loses a commit exits 3 with one line saying so; at least one succeeds; the
    feature tables hold exactly what a single run writes (the demo already ran this hour) and the
    audit one row per scored pair."""
    from deltalake import DeltaTable

    from tests.conftest import serving_tables

    lake, _ = demo_lake
    cfg = tmp_path / "shared.toml"
    cfg.write_text('[spark]\nmaster = "local[1]"\n[spark.extra]\n'
                   + "".join(f'"{k}" = "{v}"\n' for k, v in shared_metastore.items()) + '[models]\ndevice = "cpu"\n')
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    # The metastore's own schema is created once, by its first client (a cluster runs Hive's
    # schematool once); two first clients at once deadlock inside Derby, which says nothing of SOLARIS.
    subprocess.run([sys.executable, "-m", "include.sql", "SHOW DATABASES", "--config", str(cfg)], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=600)
    before = serving_tables(lake)
    at = "2026-01-05T03:00:00"
    runs = [subprocess.Popen([sys.executable, "-m", "spark_jobs.precompute", "--at", at, "--config", str(cfg)], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [(p.returncode, out, err) for p in runs for out, err in [_finish(p, runs, timeout=600)]]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes in ([0, 0], [0, 3]), [(c, e[-3000:]) for c, _, e in outcomes]
    for code, out, err in outcomes:
        if code == 0:
            assert f"precompute run {at}" in out
        else:  # the loser: one line that says what happened and what to do, after Spark's own log
            last = err.strip().splitlines()[-1]
            assert last.startswith(f"error: python -m spark_jobs.precompute --at {at} lost a write race") and "rerun it" in last
    assert serving_tables(lake) == before
    audit = DeltaTable(str(lake / "tables" / "verifier_scores")).to_pandas()
    audit = audit[audit["run_id"] == at]
    assert len(audit) > 0 and not audit.duplicated(["user_id", "item_id"]).any()
