"""The Airflow UI as a user meets it: `make airflow` (standalone, SQLite), log in with headless
Chromium, trigger solaris_precompute for one hour of the demo's synthetic log, and watch the run
succeed, while the run's precompute task is killed mid-write and Airflow retries it. This is the
suite's real chain of Airflow -> spark-submit -> Delta tables. A screenshot of the finished run is
saved under test-artifacts/."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from pathlib import Path

import pytest

from tests.conftest import ROOT, airflow_home, api, free_port, serving_tables, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.airflow, pytest.mark.browser]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
DAG = "solaris_precompute"


@pytest.fixture(scope="module")
def airflow(demo_lake, airflow_db, tmp_path_factory):
    """`make airflow` on the demo lake, on a free port, until the DAGs are parsed; stopped after."""
    if not (CHROMIUM and CHROMEDRIVER):
        msg = "chromium and chromedriver are needed (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("SOLARIS_REQUIRE_BROWSER"):
            pytest.fail(msg)
        pytest.skip(msg)
    lake, _ = demo_lake
    home = airflow_home(airflow_db, tmp_path_factory.mktemp("airflow_ui"))
    port = free_port()
    config = home / "solaris.toml"  # retries seconds apart, not minutes: the retry test waits for one
    config.write_text("[orchestration]\nretries = 2\nretry_delay_seconds = 2\n")
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "SOLARIS_CONFIG": str(config),
           # Only runs triggered by hand: unpausing would otherwise also schedule the hour that
           # just ended on the wall clock, which the 2026-01-05 synthetic log has no traffic for.
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}
    log = (home / "standalone.log").open("w")
    venv = Path(sys.executable).parent.parent
    # -o install: the suite already runs inside the installed virtualenv; do not reinstall it.
    proc = subprocess.Popen(["make", "-s", "-o", "install", "airflow", f"AIRFLOW_DIR={home}",
                             f"AIRFLOW_PORT={port}", f"VENV={venv}"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        token = None
        while token is None:
            assert proc.poll() is None, f"airflow standalone exited {proc.returncode}:\n{tail(home)}"
            assert time.monotonic() < deadline, f"Airflow did not come up in 600 s:\n{tail(home)}"
            time.sleep(3)
            try:
                password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
                token = api(base, "/auth/token", body={"username": "admin", "password": password})["access_token"]
                api(base, f"/api/v2/dags/{DAG}", token)  # parsed and in the database
            except (OSError, ValueError, KeyError, urllib.error.URLError):
                token = None
        yield base, password, token, home
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def tail(home: Path, n: int = 4000) -> str:
    p = home / "standalone.log"
    return p.read_text()[-n:] if p.exists() else "(no log)"


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.implicitly_wait(0)
    yield d
    d.quit()


def shown(d, css: str):
    from selenium.webdriver.common.by import By

    return [e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


@pytest.mark.timeout(3600)
def test_trigger_the_hourly_dag_in_the_ui_and_watch_it_succeed_through_a_killed_task(airflow, browser, demo_lake):
    """The UI triggers the hour [02:00, 03:00); its precompute task's spark-submit is SIGKILLed right
    after its first commit (the audit table), before the MERGE into pair_embeddings. Airflow marks
    the try failed and retries it under `[orchestration]`; the retry succeeds, the run ends Success
    in the UI, and the feature tables hold exactly what they held before (the demo ran this hour):
    the killed try left no partial write behind."""
    from deltalake import DeltaTable
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    base, password, token, home = airflow
    lake, _ = demo_lake
    before = serving_tables(lake)
    audit, pairs = (str(lake / "tables" / n) for n in ("verifier_scores", "pair_embeddings"))
    audit_version, pairs_version = DeltaTable(audit).version(), DeltaTable(pairs).version()
    d = browser
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "airflow_ui_solaris_precompute.png"
    try:
        # Log in through the simple auth manager's form.
        d.get(base + "/")
        wait_for("the login form", lambda: shown(d, "input[name=username]"), 60)[0].send_keys("admin")
        shown(d, "input[name=password]")[0].send_keys(password)
        shown(d, "button[type=submit]")[0].click()
        wait_for("the home page", lambda: "/auth/login" not in d.current_url, 60)

        # The DAG page, paused as every DAG starts; the trigger dialog for the hour [02:00, 03:00).
        d.get(f"{base}/dags/{DAG}")
        wait_for("the Trigger button", lambda: shown(d, "[data-testid=trigger-dag-button]"), 60)[0].click()
        wait_for("the logical-date picker", lambda: shown(d, "[role=dialog] [data-testid=datetime-input]"), 30)[0].click()
        picker = wait_for("the date and time fields", lambda: [
            p for p in shown(d, "[data-scope=popover][data-part=content]") if len(p.find_elements(By.CSS_SELECTOR, "input")) >= 2], 30)[0]
        date_in, time_in = picker.find_elements(By.CSS_SELECTOR, "input")[:2]
        for field, value in ((date_in, "2026/01/05"), (time_in, "03:00")):
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value, Keys.TAB)
        d.find_element(By.XPATH, "//label[text()='Logical Date']").click()  # closes the picker
        wait_for("the chosen logical date", lambda: shown(d, "[data-testid=datetime-input]")[0].text == "Jan 05, 2026 03:00", 10)
        unpause = d.find_element(By.XPATH, f"//label[contains(., 'Unpause {DAG} on trigger')]//input")
        assert unpause.is_selected()  # the DAG is paused; triggering from the dialog unpauses it
        shown(d, "[data-testid=trigger-dag-submit]")[0].click()

        # The run's precompute task, killed between its two writes: what a lost node does to a task.
        wait_for("the precompute task's audit commit", lambda: DeltaTable(audit).version() > audit_version, 1800,
                 every=0.05)
        assert kill_processes_of(str(ROOT / "spark_jobs" / "precompute.py")) >= 1
        assert DeltaTable(pairs).version() == pairs_version  # killed between its two writes

        # The UI opens the new run; its state badge follows the run until it ends.
        wait_for("the run page", lambda: "/runs/" in d.current_url, 60)
        run_url = d.current_url
        run_id = urllib.parse.unquote(run_url.split("/runs/", 1)[1].split("?")[0])
        badge = f"//h2[normalize-space()='{run_id}']/following-sibling::span[@data-testid='state-badge'][1]"
        wait_for("the run's state badge", lambda: shown(d, "[data-testid=state-badge]"), 60)

        # While the run goes on, the browser waits on a blank page: the run page re-renders on every
        # poll, and on two cores its renderer takes a third of one from the Spark jobs. The REST API
        # says when the run ended; the UI must then show the same state on the run's own page.
        d.get("about:blank")
        q = urllib.parse.quote(run_id, safe="")
        wait_for("the run to finish", lambda: api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}", token)["state"]
                 in ("success", "failed"), 3000, every=5)
        d.get(run_url)
        state = wait_for("the run's final state in the UI", lambda: next(
            (s for s in (e.text.strip() for e in d.find_elements(By.XPATH, badge)) if s in ("Success", "Failed")), None), 60)
        time.sleep(2)
    finally:
        d.save_screenshot(str(shot))
    assert state == "Success", f"the run ended {state}; screenshot {shot}\n{tail(home)}"

    # What the UI showed, from the REST API: the hour that ended at 03:00, every task succeeded.
    run = api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}", token)
    assert (run["state"], run["run_type"]) == ("success", "manual")
    assert run["data_interval_start"].startswith("2026-01-05T02:00:00") and run["data_interval_end"].startswith("2026-01-05T03:00:00")
    tis = api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances", token)["task_instances"]
    assert sorted(t["task_id"] for t in tis) == sorted(
        ["spark_properties", "validate_requests", "resolve_features", "precompute", "user_means",
         "user_neighbors", "validate_features", "publish", "publish_redis"])
    assert {t["state"] for t in tis} == {"success"}
    # The interval reached the Spark jobs from Airflow: rendered into the arguments, and the job's own
    # output (the run's counters, printed by spark_jobs/precompute.py) is in the task's log.
    pre = next(t for t in tis if t["task_id"] == "precompute")
    assert pre["rendered_fields"]["application_args"] == ["--at", "2026-01-05T03:00:00+00:00"]
    log = api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances/precompute/logs/{pre['try_number']}?full_content=true", token)
    assert "precompute run 2026-01-05T03:00:00 (window " in json.dumps(log["content"])

    # The killed try (kept in the history as failed, or as up_for_retry when it was archived), then
    # Airflow's retries until one succeeds: one on an idle machine; a second where the killed JVM was
    # still letting go of the metastore when the first retry started.
    tries = api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances/precompute/tries", token)["task_instances"]
    states = [t["state"] for t in sorted(tries, key=lambda t: t["try_number"])]
    assert len(states) >= 2 and states[-1] == "success", states
    assert all(s in ("failed", "up_for_retry") for s in states[:-1]), states
    log = api(base, f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances/precompute/logs/1?full_content=true", token)
    assert "-9" in json.dumps(log["content"])  # spark-submit's exit by SIGKILL, as the operator reported it
    assert serving_tables(lake) == before  # the demo had run this hour; the retry rewrote the same rows
    assert DeltaTable(pairs).version() == pairs_version + 1  # one MERGE commit, the retry's
    assert shot.stat().st_size > 10_000


def kill_processes_of(needle: str) -> int:
    """SIGKILL every process whose command line holds ``needle`` (the spark-submit JVM and the Python
    driver it started): what a lost node does to a task. Returns how many were killed."""
    import psutil

    killed = 0
    for p in psutil.process_iter(["cmdline"]):
        if any(needle in part for part in p.info["cmdline"] or ()):
            try:
                p.kill()
                killed += 1
            except psutil.NoSuchProcess:
                pass
    return killed
