"""The Spark driver's class-data sharing archive (include/class_data.py): every driver maps the one
`make install` built for this machine, and a driver without one starts as before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from include import class_data
from include.config import SolarisConfig
from include.spark import spark_conf
from tests.conftest import ROOT


def driver_options(cfg: SolarisConfig) -> str:
    return spark_conf(cfg)["spark.driver.extraJavaOptions"]


def test_a_driver_maps_the_archive_where_there_is_one_and_starts_without_it_where_not(tmp_path, monkeypatch):
    monkeypatch.setenv("SOLARIS_IVY_HOME", str(tmp_path / "ivy"))
    cfg = SolarisConfig().with_overrides(lake={"root": str(tmp_path / "lake")},
                                         spark={"driver_java_options": "-Xss4m"})
    path = class_data.archive_path()
    assert path is not None and path.parent == tmp_path / "ivy" / "solaris" and path.suffix == ".jsa"
    assert "SharedArchiveFile" not in driver_options(cfg)  # none built here: the flags SOLARIS always sets
    assert driver_options(cfg).endswith("-Xss4m")

    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    assert "SharedArchiveFile" not in driver_options(cfg)  # no record of its size: never handed to a JVM
    class_data.size_record(path).write_text("10\n")
    assert f"-XX:SharedArchiveFile={path} {class_data.QUIET}" in driver_options(cfg)
    assert driver_options(cfg).endswith("-Xss4m")  # the operator's flags come last: they win
    off = cfg.with_overrides(spark={"class_data_sharing": False})
    assert "SharedArchiveFile" not in driver_options(off)


def test_the_archive_is_named_by_the_java_pyspark_and_delta_it_was_built_for(tmp_path, monkeypatch):
    monkeypatch.setenv("SOLARIS_IVY_HOME", str(tmp_path / "ivy"))
    here = class_data.archive_path()
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert class_data.java_binary() == other_java
    assert class_data.archive_path() != here  # another Java: another archive, never one built for the first
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert class_data.archive_path() is None and class_data.java_options() == ""


@pytest.mark.spark
@pytest.mark.slow
def test_a_driver_started_by_a_job_maps_the_archive_that_make_install_built(tmp_path):
    """With ``-Xshare:on`` a JVM that cannot map its archive refuses to start: the job below runs
    only if the driver really maps the archive; a damaged archive stops the same command."""
    path = class_data.archive_path()
    assert path is not None and path.is_file(), f"no class-data archive at {path}: `make install` builds it"
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(tmp_path / "lake"), "SOLARIS_SPARK_MASTER": "local[1]",
           "SOLARIS_SPARK_DRIVER_JAVA_OPTIONS": "-Xshare:on"}
    p = subprocess.run([sys.executable, "-m", "include.sql", "--json", "SELECT 41 + 1 AS answer"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and '{"answer": 42}' in p.stdout, p.stderr[-3000:]

    # Cut short (a full disk, an interrupted copy): a JVM would crash mapping it, so no driver is
    # given it; the job runs without it. Damaged in its header at full size: -Xshare:on refuses.
    ivy = tmp_path / "ivy" / "solaris"
    ivy.mkdir(parents=True)
    cut = ivy / path.name
    cut.write_bytes(path.read_bytes()[:4096])
    class_data.size_record(cut).write_text(class_data.size_record(path).read_text())
    ivy_env = {**env, "SOLARIS_IVY_HOME": str(tmp_path / "ivy")}
    p = subprocess.run([sys.executable, "-m", "include.sql", "SELECT 1"], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in ivy_env.items() if k != "SOLARIS_SPARK_DRIVER_JAVA_OPTIONS"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = bytearray(path.read_bytes())
    data[:16] = bytes(16)  # the header's magic number and CRC
    cut.write_bytes(bytes(data))
    p = subprocess.run([sys.executable, "-m", "include.sql", "SELECT 1"], cwd=tmp_path, capture_output=True, text=True,
                       env=ivy_env, timeout=600)
    assert p.returncode != 0
    assert not list(tmp_path.glob("hs_err_pid*.log")), "a JVM crashed instead of refusing the archive"
