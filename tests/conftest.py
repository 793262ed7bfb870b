"""One local Spark session with Delta for the whole run; each test module gets its own database
and lake folder so tables never leak between tests."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from include.config import SolarisConfig, spark_properties
from include.spark import ensure_database
from model.training import TINY  # the model set every module that needs trained models uses (seconds on two cores)

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
DATA = Path(__file__).with_name("data")

# Spark settings for every driver the suite starts, in this process and in the jobs, Airflow tasks
# and spark-submits it starts (they read SOLARIS_SPARK_CONF through include/config.load_config).
# The suite's tables hold tens to thousands of rows, so a query costs what Spark spends planning and
# compiling it, not running it: interpreted expressions instead of Janino-compiled classes, and the
# short plan string every SQL execution records. An hourly cycle on the shared lake's world takes 0.70
# of the time warm and 0.78 cold, the suite 0.82 (benchmarks/RESULTS.md, "The suite's Spark
# settings"). Results are the same in both modes (Spark's own suite runs its tests in both).
TEST_SPARK_CONF = ("spark.sql.codegen.wholeStage=false spark.sql.codegen.factoryMode=NO_CODEGEN "
                   "spark.sql.ui.explainMode=simple")
os.environ.setdefault("SOLARIS_SPARK_CONF", TEST_SPARK_CONF)

NEEDS = ("spark", "e2e", "airflow", "browser", "redis", "compose", "compose_stack", "slow", "real_data")


# Modules whose tests share the demo lake (one main-job run, minutes): one xdist group, one worker.
DEMO_MODULES = {"test_end_to_end", "test_airflow_ui"}


def pytest_collection_modifyitems(config, items):
    """Mark by need: a test using the Spark fixtures is ``spark``; one that needs nothing is ``unit``.
    Under ``--dist loadgroup`` each module runs whole on one worker, so its module-scoped lake is
    built once; the demo lake's modules share one group."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        item.add_marker(pytest.mark.xdist_group("demo" if module in DEMO_MODULES else module))
        if {"spark", "make_cfg", "lake_root"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
        if not any(item.get_closest_marker(m) for m in NEEDS):
            item.add_marker(pytest.mark.unit)


def _test_config(lake_root: Path, database: str = "solaris") -> SolarisConfig:
    return SolarisConfig().with_overrides(
        lake={"root": str(lake_root), "database": database},
        spark={"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
               "extra": spark_properties(os.environ["SOLARIS_SPARK_CONF"])},
    )


@pytest.fixture(scope="session")
def lake_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def spark(lake_root):
    from include.spark import get_spark

    session = get_spark(_test_config(lake_root))
    yield session
    session.stop()


# The synthetic impression world of the shared lake: 2026-01-05 00:00 .. 12:00.
BASE_LOG = dict(users=120, items=50, hours=12, visits_per_hour=20, shown=5)


@pytest.fixture(scope="session")
def base_lake(spark, lake_root, tmp_path_factory):
    """One tiny synthetic impression world ingested and the TINY model set trained on it, once for the
    whole run. Modules take a copy of it (``copy_lake``) instead of ingesting and training their own."""
    return build_base_lake(spark, lake_root / "base", tmp_path_factory.mktemp("base_log"))


def build_base_lake(spark, root: Path, log_folder: Path) -> SolarisConfig:
    """The shared lake at ``root`` (database ``t_base``): the ``BASE_LOG`` world written to
    ``log_folder``, ingested, and the TINY model set trained on it; its config."""
    from include import synthetic_world
    from model import training
    from spark_jobs.ingest import ingest

    cfg = _test_config(root, database="t_base")
    ensure_database(spark, cfg)
    synthetic_world.write(synthetic_world.generate(synthetic_world.WorldConfig(**BASE_LOG)), log_folder)
    ingest(spark, cfg, "synthetic", str(log_folder))
    training.train_all(cfg, "synthetic", TINY, log=lambda *_: None)
    return cfg


def copy_lake(spark, base: SolarisConfig, cfg: SolarisConfig, models: bool = True) -> SolarisConfig:
    """A module's own lake as a copy of ``base``'s tables (and model registry), registered in the
    module's database: what the module writes never reaches another module."""
    import shutil

    from feature_store.tables import ensure_tables

    shutil.copytree(base.lake.tables_path, cfg.lake.tables_path)
    if models:
        shutil.copytree(base.models_root, cfg.models_root)
    ensure_database(spark, cfg)
    ensure_tables(spark, cfg)
    return cfg


@pytest.fixture
def make_cfg(spark, lake_root, request):
    """cfg(name) -> a config with its own database and table folder, on the shared session."""

    def make(name: str | None = None, **sections) -> SolarisConfig:
        name = name or re.sub(r"\W+", "_", request.node.name).lower()[:40]
        cfg = _test_config(lake_root / name, database=f"t_{name}")
        if sections:
            cfg = cfg.with_overrides(**sections)
        ensure_database(spark, cfg)
        return cfg

    return make


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip("../shared/datasets is not present (fresh clone): real-data slice skipped")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def airflow_db(tmp_path_factory) -> Path:
    """An Airflow metadata database (SQLite) migrated once per run; ``airflow_home`` copies it into
    each test's own AIRFLOW_HOME, so no test migrates a database of its own."""
    import subprocess

    home = tmp_path_factory.mktemp("airflow_db")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    p = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return home / "airflow.db"


def airflow_home(db: Path, home: Path) -> Path:
    """``home`` as an AIRFLOW_HOME holding a copy of the migrated database ``db``."""
    import shutil

    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, home / "airflow.db")
    return home


def python() -> str:
    return sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def api(base: str, path: str, token: str | None = None, body: dict | None = None, method: str | None = None) -> dict:
    """One JSON request to a REST API the test started (Airflow's, the lookup's): the decoded answer.
    ``body`` makes it a POST (or ``method``); ``token`` is sent as a bearer token."""
    import json
    import urllib.request

    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def wait_for(what: str, check, timeout: float, every: float = 0.5, errors: tuple = (Exception,), detail=None):
    """``check()``'s first truthy answer, asked every ``every`` seconds; an exception in ``errors``
    counts as not yet (a page still rendering, a server not up). After ``timeout`` seconds: fail,
    saying what was awaited and, with ``detail``, what ``detail()`` returns (e.g. service logs)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except errors:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{detail()}" if detail else ""))
        time.sleep(every)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server a test starts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    """A Spark standalone master and one worker (one core) on loopback, started from pyspark's own
    scripts: ``url`` to submit to, ``state()`` the master's JSON (workers, applications), ``env``
    what a driver process needs beside its own settings."""

    def __init__(self, tmp_path: Path, master_opts: str = "", worker_opts: str = "", cores: int = 1,
                 memory: str = "1g", env: dict | None = None):
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(tmp_path / "spark-worker"), **(env or {})}
        for k in ("SPARK_SUBMIT_OPTS", "SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
            self.env.pop(k, None)
        self._args = (master_opts, worker_opts, str(cores), memory)
        self.logs = tmp_path
        self.daemons: list = []

    def state(self) -> dict:
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
            return json.load(r)

    def __enter__(self) -> "StandaloneCluster":
        import subprocess
        import time

        master_opts, worker_opts, cores, memory = self._args
        spark_class = os.path.join(self.home, "bin", "spark-class")

        def start(args, opts, log):  # a session of its own: stopped with all its children
            return subprocess.Popen([spark_class, *args], env={**self.env, **opts}, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=open(self.logs / log, "w"))

        self.daemons.append(start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                   str(self.port), "--webui-port", str(self.ui)],
                                  {"SPARK_MASTER_OPTS": master_opts}, "spark-master.log"))
        deadline = time.time() + 120
        while True:
            try:
                self.state()
                break
            except OSError:
                if time.time() > deadline:
                    self.__exit__(None, None, None)
                    pytest.fail("the Spark master did not start: " + (self.logs / "spark-master.log").read_text()[-2000:])
                time.sleep(0.5)
        self.daemons.append(start(["org.apache.spark.deploy.worker.Worker", "--cores", cores, "--memory", memory,
                                   "--host", "127.0.0.1", "--webui-port", str(free_port()), self.url],
                                  {"SPARK_WORKER_OPTS": worker_opts}, "spark-worker.log"))
        while not [w for w in self.state()["workers"] if w["state"] == "ALIVE"]:
            if time.time() > deadline:
                self.__exit__(None, None, None)
                pytest.fail("the Spark worker did not register: " + (self.logs / "spark-worker.log").read_text()[-2000:])
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for p in self.daemons:
            os.killpg(p.pid, signal.SIGTERM)
        for p in self.daemons:
            p.wait(60)


def run(args, lake, timeout=1800, extra_env=None, both=False, **kw):
    """Run a command as a user would, on ``lake``; fail with its output unless it exits 0."""
    import subprocess

    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake), "SOLARIS_SPARK_MASTER": "local[2]",
           # as with an activated virtualenv: spark-submit finds pyspark's Spark through this python
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **(extra_env or {})}
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{args} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p.stdout + p.stderr if both else p.stdout


@pytest.fixture(scope="session")
def demo_lake(tmp_path_factory, spark):
    """The main job exactly as `make demo` runs it, on a tiny synthetic log (shared by the
    end-to-end, SQL and Airflow UI tests, each of which leaves its tables as it found them); its
    console output (stdout and stderr). After this process's session started, so the Delta jars
    are resolved already, as on every run but a machine's first."""
    lake = tmp_path_factory.mktemp("demo") / "lake"
    out = run([sys.executable, "-m", "spark_jobs.pipeline", "--synthetic-users", "80", "--synthetic-items", "40",
               "--synthetic-hours", "4", "--precompute-hours", "2", "--reports", str(lake.parent / "reports")], lake,
              both=True)
    return lake, out


def serving_tables(lake: Path) -> dict:
    """The feature tables' rows, order-free, read with delta-rs: equal before and after an
    idempotent rerun of an interval."""
    from deltalake import DeltaTable

    out = {}
    for name in ("pair_embeddings", "user_mean_embeddings", "user_neighbors", "request_features"):
        df = DeltaTable(str(lake / "tables" / name)).to_pandas()
        cols = [c for c in df.columns if c != "embedding"]
        out[name] = (sorted(map(tuple, df[cols].astype(str).to_numpy())),
                     sorted(tuple(map(float, e)) for e in df["embedding"]) if "embedding" in df else None)
    return out
