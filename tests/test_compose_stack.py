"""docker-compose.yml brought up for real: a Docker engine of the test's own, the SOLARIS image and
stand-ins for PostgreSQL and Redis built from a local Debian base, the whole stack started with
`docker compose up`, the demo's synthetic log written into the shared lake by a job on the Spark
cluster, one hour of solaris_precompute triggered through Airflow's REST API, and its results read
back: the tables through `include.sql` in the job container, the lookup container's snapshot, the
namespace in Redis. `docker compose down -v` at the end.

It needs root (dockerd, debootstrap), Debian's docker.io and debootstrap, the compose plugin, and
several minutes: it runs with `make test-compose`, not in `make test` (docs in
docs/compose.md). The engine keeps its images under ``SOLARIS_DOCKER_ROOT`` (default
``~/.cache/solaris/dockerd``) so a second run reuses the built layers; its socket, state and logs
live in the test's temporary folder, and it is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from include.compose_secrets import generate
from tests.conftest import ROOT, api, free_port, wait_for
from tests.test_gpu_dispatch import DRIVER as GPU_DRIVER

pytestmark = [pytest.mark.slow, pytest.mark.compose_stack]
if not os.environ.get("SOLARIS_TEST_COMPOSE_STACK"):
    pytest.skip("the compose stack test runs with `make test-compose` (root, a Docker engine, minutes)",
                allow_module_level=True)

BASE = os.environ.get("SOLARIS_BASE_IMAGE", "solaris-base:bookworm")
PROJECT = "solaris-stack-test"
DAG = "solaris_precompute"
# The demo's synthetic log: 2026-01-05 00:00 .. 04:00; the DAG computes the hour ending 03:00.
DEMO = ["python", "-m", "spark_jobs.pipeline", "--synthetic-users", "80", "--synthetic-items", "40",
        "--synthetic-hours", "4", "--precompute-hours", "0"]
HOUR_END = "2026-01-05T03:00:00"
TIMINGS: dict[str, float] = {}


def _need(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is needed: {hint}")
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A dockerd of the test's own: its socket and state in a temporary folder, stopped by PID."""
    if os.geteuid() != 0:
        pytest.fail("the compose stack test starts dockerd and debootstrap: run it as root")
    dockerd = _need("dockerd", "Debian: apt-get install docker.io")
    _need("debootstrap", "Debian: apt-get install debootstrap")
    run_dir = tmp_path_factory.mktemp("dockerd")
    data_root = Path(os.environ.get("SOLARIS_DOCKER_ROOT", Path.home() / ".cache" / "solaris" / "dockerd"))
    data_root.mkdir(parents=True, exist_ok=True)
    sock = run_dir / "docker.sock"
    log = (run_dir / "dockerd.log").open("w")
    proc = subprocess.Popen([dockerd, "--data-root", str(data_root), "--exec-root", str(run_dir / "exec"),
                             "--pidfile", str(run_dir / "dockerd.pid"), "--host", f"unix://{sock}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}",
           # No buildx plugin beside Debian's engine: the classic builder builds the images.
           "DOCKER_BUILDKIT": "0"}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
            assert proc.poll() is None, f"dockerd exited {proc.returncode}:\n{(run_dir / 'dockerd.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "dockerd did not answer in 60 s"
            time.sleep(0.5)
        compose = subprocess.run(["docker", "compose", "version"], env=env, capture_output=True, text=True)
        if compose.returncode != 0:
            pytest.fail("the docker compose plugin is needed (bash .ci/install-compose builds it)")
        yield env, run_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def sh(args: list[str], env: dict, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"{' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def timed(name: str, fn):
    started = time.monotonic()
    out = fn()
    TIMINGS[name] = time.monotonic() - started
    print(f"[compose stack] {name}: {TIMINGS[name]:.0f} s", flush=True)
    return out


@pytest.fixture(scope="module")
def images(engine):
    """The local base, the stand-ins and the SOLARIS image (layers reused from earlier runs)."""
    env, _ = engine
    build = ["docker", "build", "--quiet", "--build-arg", f"BASE={BASE}"]
    timed("local base image", lambda: sh([str(ROOT / "docker" / "local-base"), BASE], env))
    timed("stand-in images", lambda: [
        sh([*build, "-f", f"docker/{name}.Dockerfile", "-t", f"solaris-standin-{name}", "docker"], env)
        for name in ("postgres", "redis")])
    timed("SOLARIS image", lambda: sh([*build, "-t", "solaris:latest", "."], env, timeout=3600))
    return env


@pytest.fixture(scope="module")
def stack(images, engine):
    """`docker compose up -d` with the test's override; yields (compose command, env, ports);
    `docker compose down -v` after, with the services' logs kept beside the engine's."""
    env, run_dir = images, engine[1]
    env_file = run_dir / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in generate().items()))
    ports = {"SOLARIS_TEST_AIRFLOW_PORT": free_port(), "SOLARIS_TEST_SPARK_UI_PORT": free_port(),
             "SOLARIS_TEST_LOOKUP_PORT": free_port()}
    env = {**env, **{k: str(v) for k, v in ports.items()}, "SOLARIS_BASE_IMAGE": BASE,
           "SOLARIS_POSTGRES_IMAGE": "solaris-standin-postgres", "SOLARIS_REDIS_IMAGE": "solaris-standin-redis"}
    compose = ["docker", "compose", "--project-name", PROJECT, "--env-file", str(env_file),
               "-f", "docker-compose.yml", "-f", "docker/compose.test.yml"]
    sh([*compose, "down", "-v", "--remove-orphans"], env)  # what an interrupted run left
    try:
        up = timed("docker compose up", lambda: sh([*compose, "up", "-d", "--no-build"], env, timeout=600, check=False))
        if up.returncode != 0:
            logs = sh([*compose, "logs", "--no-color", "--tail", "40"], env, check=False).stdout
            pytest.fail(f"docker compose up exited {up.returncode}:\n{up.stderr[-2000:]}\n{logs[-8000:]}")
        yield compose, env, ports
    finally:
        logs = sh([*compose, "logs", "--no-color"], env, check=False)
        (run_dir / "stack.log").write_text(logs.stdout + logs.stderr)
        print(f"[compose stack] service logs: {run_dir / 'stack.log'}")
        sh([*compose, "down", "-v", "--remove-orphans"], env, timeout=600, check=False)


def sql(compose: list[str], env: dict, query: str) -> list[dict]:
    """``python -m include.sql --json`` in a one-off job container on the shared lake."""
    out = sh([*compose, "run", "--rm", "--no-deps", "solaris", "python", "-m", "include.sql", "--json", query], env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.timeout(5400)
def test_compose_up_runs_the_stack_and_an_hourly_dag_run_writes_serves_and_publishes(stack):
    compose, env, ports = stack
    base = f"http://127.0.0.1:{ports['SOLARIS_TEST_AIRFLOW_PORT']}"
    lookup = f"http://127.0.0.1:{ports['SOLARIS_TEST_LOOKUP_PORT']}"

    def service_logs(n: int = 60) -> str:
        return sh([*compose, "logs", "--no-color", "--tail", str(n)], env, check=False).stdout[-6000:]

    # Airflow's api-server is up and the DAG parsed; the admin password is in its home volume.
    def login():
        password = json.loads(sh([*compose, "exec", "-T", "airflow-apiserver", "cat",
                                  "/opt/airflow/simple_auth_manager_passwords.json.generated"], env,
                                 check=False).stdout)["admin"]  # written once the api-server has started
        token = api(base, "/auth/token", body={"username": "admin", "password": password})["access_token"]
        api(base, f"/api/v2/dags/{DAG}", token)
        return token

    waiting = dict(every=3.0, errors=(OSError, ValueError, KeyError), detail=service_logs)  # URLError is an OSError
    token = timed("Airflow ready", lambda: wait_for("Airflow's api-server and the parsed DAG", login, 600, **waiting))
    # The lookup answers before anything is published, and says it is not ready.
    status = wait_for("the lookup", lambda: api(lookup, "/v1/status"), 120, **waiting)
    assert status["ready"] is False

    # The demo's synthetic log into the shared lake, by a job on the Spark cluster; the models too.
    timed("demo job on the cluster", lambda: sh([*compose, "run", "--rm", "solaris", *DEMO], env, timeout=3600))
    requests = sql(compose, env, "SELECT count(*) AS n FROM solaris.request_log")
    assert requests and requests[0]["n"] > 0

    # One hour of solaris_precompute through the REST API, as a user triggers it.
    api(base, f"/api/v2/dags/{DAG}", token, {"is_paused": False}, method="PATCH")
    run_id = api(base, f"/api/v2/dags/{DAG}/dagRuns", token, {"logical_date": HOUR_END + "Z"})["dag_run_id"]
    path = f"/api/v2/dags/{DAG}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
    state = timed("DAG run", lambda: wait_for(f"run {run_id} to finish",
                                              lambda: (s := api(base, path, token)["state"]) in ("success", "failed") and s,
                                              3000, **waiting))
    tis = api(base, f"{path}/taskInstances", token)["task_instances"]
    assert state == "success", {t["task_id"]: t["state"] for t in tis}
    assert {t["state"] for t in tis} == {"success"}
    # The Spark work ran on the cluster: its master lists a finished application for the demo job, the
    # SQL check and each of the DAG's seven Spark stages.
    spark_ui = f"http://127.0.0.1:{ports['SOLARIS_TEST_SPARK_UI_PORT']}"
    master = api(spark_ui, "/json/")
    assert len(master["workers"]) == 2
    finished = [a for a in master["completedapps"] if a["state"] == "FINISHED"]
    assert len(finished) >= 1 + 1 + 7, master["completedapps"]

    # The hour's tables, read with SQL in the job container: one query (each container starts a Spark
    # driver): the newest publication, the row counts (pair_embeddings holds this run's only), one pair.
    rows = sql(compose, env, "SELECT v.run_id, CAST(v.interval_end AS STRING) AS t, "
                             "(SELECT count(*) FROM solaris.pair_embeddings) AS pairs, "
                             "(SELECT count(*) FROM solaris.user_mean_embeddings) AS means, "
                             "p.user_id, p.item_id, p.embedding "
                             "FROM (SELECT * FROM solaris.feature_versions ORDER BY published_at DESC LIMIT 1) v "
                             "CROSS JOIN (SELECT user_id, item_id, embedding FROM solaris.pair_embeddings "
                             "ORDER BY user_id, item_id LIMIT 1) p")
    assert len(rows) == 1, rows
    pub = pair = rows[0]
    assert pub["t"].startswith(HOUR_END.replace("T", " ")), pub
    assert pub["pairs"] > 0 and pub["means"] > 0

    # The lookup container reloads and serves that snapshot.
    status = wait_for("the lookup to load the new snapshot",
                      lambda: (s := api(lookup, "/v1/status"))["snapshot_run_id"] == pub["run_id"] and s, 120,
                      **{**waiting, "every": 1.0})
    assert status["ready"] is True and status["snapshot_stats"]["pairs"] == pub["pairs"]
    answer = api(lookup, "/v1/lookup", body={"user_id": pair["user_id"], "item_ids": [pair["item_id"]],
                                             "now": HOUR_END.replace("00:00", "30:00")})
    assert answer["snapshot"] == pub["run_id"] and answer["tiers"] == ["exact"]
    assert answer["embeddings"][0] == pytest.approx(pair["embedding"], rel=1e-6)
    # GPU dispatch on the cluster: each worker offers one (fake) GPU; a task of a stage that asks for
    # one gets the address Spark assigned it and, torch seeing no GPU, runs on the CPU; a stage that
    # asks for none holds none (the driver of tests/test_gpu_dispatch.py, in a job container).
    assert all(w["resources"].get("gpu", {}).get("addresses") == ["0"] for w in master["workers"]), master["workers"]
    conf = {"spark.executor.resource.gpu.amount": "1", "spark.executor.resource.gpu.discoveryScript": "/etc/solaris/fake-gpu.sh"}
    probe = timed("GPU probe job", lambda: sh([*compose, "run", "--rm", "solaris", "python", "-c", GPU_DRIVER, json.dumps(conf),
                                               "spark://spark-master:7077", "1"], env, timeout=600))
    result = json.loads(probe.stdout.split("RESULT ", 1)[1])
    assert result == {"with": [["0", "cpu"]], "without": [["", "fallback"]]}

    # Every SOLARIS container runs as the unprivileged user the image makes.
    for service in ("lookup", "airflow-scheduler", "spark-worker-1"):
        assert sh([*compose, "exec", "-T", service, "id", "-un"], env).stdout.strip() == "solaris"

    # Redis holds the published namespace, and the pointer names it (the password, from the
    # container's environment, lets redis-cli in).
    def redis(*args: str) -> str:
        return sh([*compose, "exec", "-T", "redis", "sh", "-c", 'REDISCLI_AUTH="$REDIS_PASSWORD" redis-cli "$@"', "--",
                   *args], env).stdout.strip()

    current = redis("GET", "solaris:current")  # a namespace of its own per publish: solaris:<run>:<ns>
    assert current.startswith(f"solaris:{pub['run_id']}:")
    meta = json.loads(redis("GET", f"{current}:meta"))
    assert meta["run_id"] == pub["run_id"]
    # and without the password Redis answers nothing
    anonymous = sh([*compose, "exec", "-T", "redis", "redis-cli", "GET", "solaris:current"], env, check=False)
    assert "NOAUTH" in anonymous.stdout + anonymous.stderr
    print("[compose stack] timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in TIMINGS.items()))
