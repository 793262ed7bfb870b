"""One local Spark session with Delta for the whole run; each test module gets its own database
and lake folder so tables never leak between tests."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from include.config import SolarisConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
DATA = Path(__file__).with_name("data")


def _test_config(lake_root: Path, database: str = "solaris") -> SolarisConfig:
    return SolarisConfig().with_overrides(
        lake={"root": str(lake_root), "database": database},
        spark={"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g"},
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


@pytest.fixture
def make_cfg(spark, lake_root, request):
    """cfg(name) -> a config with its own database and table folder, on the shared session."""

    def make(name: str | None = None, **sections) -> SolarisConfig:
        name = name or re.sub(r"\W+", "_", request.node.name).lower()[:40]
        cfg = _test_config(lake_root / name, database=f"t_{name}")
        if sections:
            cfg = cfg.with_overrides(**sections)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {cfg.lake.database}")
        return cfg

    return make


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip("../shared/datasets is not present (fresh clone): real-data slice skipped")
    return SHARED_DATASETS


def python() -> str:
    return sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
