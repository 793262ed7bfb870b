"""docker-compose.yml as `docker compose config` resolves it: every service the cluster needs, one
image with the Delta jars baked in, one lake volume, and Airflow wired to PostgreSQL and Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.compose

AIRFLOW = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
SPARK = ("spark-master", "spark-worker-1", "spark-worker-2")


SECRETS = {"SOLARIS_DB_PASSWORD": "test-db", "AIRFLOW_JWT_SECRET": "test-jwt", "AIRFLOW_FERNET_KEY": "test-fernet",
           "REDIS_PASSWORD": "test-redis", "SPARK_AUTH_SECRET": "test-spark"}


def compose_config(*args: str, env: dict | None = None, check: bool = True):
    """``docker compose config`` as JSON (or, with ``check=False``, the finished process)."""
    env = {**{k: v for k, v in os.environ.items() if k not in SECRETS and k != "SOLARIS_BIND"},
           **(SECRETS if env is None else env)}
    try:
        p = subprocess.run(["docker", "compose", *args, "config", "--format", "json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=env)
    except FileNotFoundError:
        p = None
    if p is None or (p.returncode != 0 and "unknown" in p.stderr.lower() and "compose" in p.stderr.lower()):
        msg = "`docker compose` is not installed (.ci/run builds it)"
        if os.environ.get("SOLARIS_REQUIRE_COMPOSE"):
            pytest.fail(msg)
        pytest.skip(msg)
    if not check:
        return p
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    return compose_config("--profile", "jobs")


def test_every_service_of_the_cluster_is_declared(config):
    assert set(config["services"]) == {"postgres", "airflow-init", *AIRFLOW, *SPARK, "redis", "lookup", "solaris"}
    # without the jobs profile, `docker compose up` starts the long-running services only
    assert "solaris" not in compose_config()["services"]


def test_solaris_services_share_one_image_and_the_lake_volume(config):
    svc = config["services"]
    for name in ("airflow-init", *AIRFLOW, *SPARK, "lookup", "solaris"):
        s = svc[name]
        assert s["image"] == "solaris:latest" and s["build"]["context"] == str(ROOT), name
        lake = [v for v in s["volumes"] if v["target"] == "/lake"]
        assert lake and lake[0]["type"] == "volume" and lake[0]["source"] == "lake", name
        assert s["environment"]["SOLARIS_LAKE_ROOT"] == "/lake", name
    assert "lake" in config["volumes"]


def test_airflow_runs_on_postgres_and_submits_to_the_spark_master(config):
    svc = config["services"]
    for name in AIRFLOW:
        env = svc[name]["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://solaris:")
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@postgres:5432/airflow")
        assert json.loads(env["AIRFLOW_CONN_SOLARIS_SPARK"]) == {"conn_type": "spark", "host": "spark://spark-master",
                                                                 "port": 7077}
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
        assert env["SOLARIS_REDIS_URL"] == "redis://:test-redis@redis:6379/0"
        assert svc[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == svc["airflow-apiserver"]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert svc["airflow-init"]["command"] == ["airflow", "db", "migrate"]
    assert svc["airflow-scheduler"]["hostname"] == "airflow-scheduler"  # executors reach the driver by name
    assert svc["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    for w in ("spark-worker-1", "spark-worker-2"):
        assert svc[w]["command"][-1].endswith("spark://spark-master:7077")


def test_secrets_come_from_the_environment_or_nothing_starts():
    from include.compose_secrets import generate

    made = generate()
    cfg = compose_config(env=made)
    env = cfg["services"]["airflow-scheduler"]["environment"]
    assert f"solaris:{made['SOLARIS_DB_PASSWORD']}@postgres" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert cfg["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == made["SOLARIS_DB_PASSWORD"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == made["AIRFLOW_JWT_SECRET"]
    assert env["AIRFLOW__CORE__FERNET_KEY"] == made["AIRFLOW_FERNET_KEY"]
    assert f":{made['REDIS_PASSWORD']}@redis:" in env["SOLARIS_REDIS_URL"]
    assert f"spark.authenticate.secret={made['SPARK_AUTH_SECRET']}" in env["SPARK_SUBMIT_OPTS"]
    assert generate() != made  # random each time
    for missing in SECRETS:
        p = compose_config(env={k: v for k, v in made.items() if k != missing}, check=False)
        assert p.returncode != 0 and f"set {missing}" in p.stderr, (missing, p.stderr)


def test_published_ports_listen_on_loopback_unless_told_otherwise():
    for env, host in ((SECRETS, "127.0.0.1"), ({**SECRETS, "SOLARIS_BIND": "0.0.0.0"}, "0.0.0.0")):
        svc = compose_config(env=env)["services"]
        published = {name: [(p["host_ip"], p["published"]) for p in s.get("ports", [])] for name, s in svc.items()}
        assert published["airflow-apiserver"] == [(host, "8080")] and published["lookup"] == [(host, "8765")]
        assert published["spark-master"] == [(host, "8081")]
        assert all(not ports for name, ports in published.items()
                   if name not in ("airflow-apiserver", "lookup", "spark-master"))


def dockerfile_instructions(path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        buf = ""
    return out


@pytest.mark.spark
def test_the_image_bakes_the_delta_jars_and_the_postgres_driver(tmp_path):
    """The Dockerfile read as instructions, in seconds (tests/test_compose_stack.py builds it for real,
    in minutes): dependencies install before the code is copied (a code change reuses that layer),
    every package of the project is copied, and the build step that bakes the Delta jars is run here
    as written: it must start (and stop) a real Spark session with Delta."""
    import re
    import shlex
    import sys

    steps = dockerfile_instructions(ROOT / "Dockerfile")
    runs = [i for i, (op, _) in enumerate(steps) if op == "RUN"]
    copies = {args.split()[0]: i for i, (op, args) in enumerate(steps) if op == "COPY"}
    deps = next(i for i in runs if "-r requirements.txt -c requirements.lock" in steps[i][1])
    packages = re.findall(r'"([a-z_]+)"', (ROOT / "pyproject.toml").read_text().split("packages =", 1)[1].split("]", 1)[0])
    assert set(packages) <= set(copies), f"the image lacks {set(packages) - set(copies)}"
    assert all(copies[pkg] > deps for pkg in packages)  # code after the dependency layer
    assert copies["requirements.txt"] < deps
    assert "psycopg2-binary" in (ROOT / "requirements.txt").read_text()  # Airflow's PostgreSQL driver
    users = [i for i, (op, args) in enumerate(steps) if op == "USER"]
    assert users and steps[users[-1]][1] == "solaris"  # containers do not run as root
    bake_at = next(i for i in runs if "get_spark(" in steps[i][1])
    assert steps[max(u for u in users if u < bake_at)][1] == "solaris"  # the jars baked into solaris's cache
    bake = next(steps[i][1] for i in runs if "get_spark(" in steps[i][1])
    snippet = shlex.split(bake.split("python -c", 1)[1].split("&&", 1)[0])[0]
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SOLARIS_LAKE_ROOT": str(tmp_path / "bake"), "SOLARIS_SPARK_MASTER": "local[1]"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "bake" / "metastore_db").is_dir()  # a real session with the Hive catalog started


def test_the_spark_containers_and_the_scheduler_share_the_input_volume(config):
    """The executors on the workers read the input logs the job container wrote (/data): every
    container that runs a Spark driver or executor mounts the same volume there."""
    svc = config["services"]
    for name in ("airflow-scheduler", *SPARK, "solaris"):
        data = [v for v in svc[name]["volumes"] if v["target"] == "/data"]
        assert data and data[0]["type"] == "volume" and data[0]["source"] == "data", name
    assert all(svc[name]["environment"]["SPARK_WORKER_DIR"].startswith("/tmp/") for name in SPARK)


def test_the_stack_test_override_uses_the_stand_ins_and_loopback_ports_it_is_given():
    """docker/compose.test.yml, as tests/test_compose_stack.py applies it: PostgreSQL and Redis from
    the local stand-ins (never pulled), the published ports replaced by the test's, and a lookup that
    answers at the synthetic log's time."""
    ports = {"SOLARIS_TEST_AIRFLOW_PORT": "18080", "SOLARIS_TEST_SPARK_UI_PORT": "18081", "SOLARIS_TEST_LOOKUP_PORT": "18765"}
    images = {"SOLARIS_POSTGRES_IMAGE": "solaris-standin-postgres", "SOLARIS_REDIS_IMAGE": "solaris-standin-redis",
              "SOLARIS_BASE_IMAGE": "solaris-base:bookworm"}
    svc = compose_config("-f", "docker-compose.yml", "-f", "docker/compose.test.yml",
                         env={**SECRETS, **ports, **images})["services"]
    for name in ("postgres", "redis"):
        assert svc[name]["image"] == f"solaris-standin-{name}" and svc[name]["pull_policy"] == "never"
    assert svc["lookup"]["build"]["args"]["BASE"] == "solaris-base:bookworm"
    published = {name: [(p["host_ip"], p["published"]) for p in s.get("ports", [])] for name, s in svc.items() if s.get("ports")}
    assert published == {"airflow-apiserver": [("127.0.0.1", "18080")], "spark-master": [("127.0.0.1", "18081")],
                         "lookup": [("127.0.0.1", "18765")]}
    config_file = svc["lookup"]["environment"]["SOLARIS_CONFIG"]
    mount = next(v for v in svc["lookup"]["volumes"] if v["target"] == config_file)
    assert mount["read_only"] and "allow_client_now = true" in open(mount["source"]).read()
    missing = compose_config("-f", "docker-compose.yml", "-f", "docker/compose.test.yml", env={**SECRETS, **images},
                             check=False)
    assert missing.returncode != 0 and any(k in missing.stderr for k in ports)  # names the missing port


def test_the_public_images_are_the_defaults_and_each_can_be_swapped(config):
    svc = config["services"]
    assert (svc["postgres"]["image"], svc["redis"]["image"]) == ("postgres:16", "redis:7")
    assert svc["lookup"]["build"]["args"]["BASE"] == "python:3.11-slim-bookworm"


def test_the_secrets_file_is_private_ignored_and_never_overwritten(tmp_path):
    import stat

    from include.compose_secrets import main

    out = tmp_path / ".env"
    assert main(["--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and "AIRFLOW_FERNET_KEY=" in out.read_text()
    before = out.read_text()
    assert main(["--out", str(out)]) == 2 and out.read_text() == before  # the keys the data was encrypted with stay
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert ignored.returncode == 0, ".env must be in .gitignore"


def test_redis_on_the_stack_answers_only_with_its_password(tmp_path):
    """The redis service's command, run here on a free port: a client without the password is
    refused (NOAUTH), and the URL the DAGs are given (SOLARIS_REDIS_URL) gets in."""
    import shutil
    import time

    import redis

    from tests.conftest import free_port

    if shutil.which("redis-server") is None:
        if os.environ.get("SOLARIS_REQUIRE_REDIS"):
            pytest.fail("redis-server is required here (SOLARIS_REQUIRE_REDIS) but not installed")
        pytest.skip("redis-server not installed")
    svc = compose_config()["services"]
    command, url = svc["redis"]["command"], svc["airflow-scheduler"]["environment"]["SOLARIS_REDIS_URL"]
    assert command[0] == "redis-server"
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server"), *command[1:], "--port", str(port), "--bind", "127.0.0.1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        anonymous = redis.Redis(port=port, socket_timeout=5)
        for _ in range(100):
            try:
                anonymous.ping()
                break
            except redis.exceptions.AuthenticationError:
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.set("k", "v")
        client = redis.Redis.from_url(url.replace("@redis:6379", f"@127.0.0.1:{port}"), socket_timeout=5)
        assert client.set("k", "v") and client.get("k") == b"v"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_spark_cluster_runs_only_jobs_that_hold_its_secret(tmp_path):
    """A Spark standalone master and worker started here with the services' SPARK_MASTER_OPTS and
    SPARK_WORKER_OPTS: a driver with the drivers' SPARK_SUBMIT_OPTS runs a job; one without them (a
    container on the network that lacks the secret) is never registered as an application."""
    import sys

    from tests.conftest import StandaloneCluster

    env_of = compose_config()["services"]
    master_opts = env_of["spark-master"]["environment"]["SPARK_MASTER_OPTS"]
    worker_opts = env_of["spark-worker-1"]["environment"]["SPARK_WORKER_OPTS"]
    submit_opts = env_of["airflow-scheduler"]["environment"]["SPARK_SUBMIT_OPTS"]
    assert "spark.authenticate=true" in master_opts and master_opts == worker_opts == submit_opts
    with StandaloneCluster(tmp_path, master_opts, worker_opts) as cluster:
        code = (f"from pyspark.sql import SparkSession; s = SparkSession.builder.master({cluster.url!r})"
                ".config('spark.executor.memory', '512m').getOrCreate(); print('COUNT', s.range(1000).count())")
        try:
            ok = subprocess.run([sys.executable, "-c", code + "; s.stop()"], capture_output=True, text=True,
                                env={**cluster.env, "SPARK_SUBMIT_OPTS": submit_opts}, timeout=240)
        except subprocess.TimeoutExpired as e:
            ok = e
        assert isinstance(ok, subprocess.CompletedProcess) and "COUNT 1000" in ok.stdout, getattr(ok, "stderr", ok)
        # No secret: the master refuses its connection (and logs why); the driver itself would wait
        # for a registration that never comes, so it is stopped once the refusal is in the log.
        master_log = cluster.logs / "spark-master.log"
        seen = len(master_log.read_text())
        outsider = subprocess.Popen([sys.executable, "-c", code], env=cluster.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            wait_for("the master to refuse the driver without the secret",
                     lambda: "SASL" in master_log.read_text()[seen:] or outsider.poll() is not None, 120,
                     detail=lambda: master_log.read_text()[-2000:])
        finally:
            os.killpg(outsider.pid, signal.SIGKILL)
        assert "COUNT 1000" not in outsider.communicate()[0]
        assert "SASL" in master_log.read_text()[seen:], master_log.read_text()[-2000:]
        apps = cluster.state()
        assert len(apps["activeapps"]) + len(apps["completedapps"]) == 1  # the job with the secret only
