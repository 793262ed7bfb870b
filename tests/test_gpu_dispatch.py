"""GPU dispatch of the embedding stage on a cluster: Spark assigns each embedding task a GPU
address from the executors' discovery script, the task reads it, and runs on the CPU where torch
sees no GPU. A standalone master and worker run here with a discovery script that reports a fake
GPU; every other stage asks for none."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from include.config import ConfigError, SolarisConfig
from tests.conftest import ROOT, StandaloneCluster

pytestmark = pytest.mark.spark

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession
from spark_jobs.embed_pairs import gpu_profile, task_device

conf = json.loads(sys.argv[1])
builder = SparkSession.builder.master(sys.argv[2]).config("spark.executor.memory", "512m")
for k, v in conf.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()

def probe(batches):
    import pandas as pd
    from pyspark import TaskContext
    gpus = TaskContext.get().resources().get("gpu")
    for pdf in batches:
        yield pd.DataFrame({"x": pdf["x"], "addresses": [",".join(gpus.addresses) if gpus else ""] * len(pdf),
                            "device": [task_device("fallback")] * len(pdf)})

df = spark.range(8).toDF("x").repartition(2)
schema = "x long, addresses string, device string"
with_gpu = df.mapInPandas(probe, schema, profile=gpu_profile(float(sys.argv[3]))).collect()
without = df.mapInPandas(probe, schema).collect()
print("RESULT", json.dumps({"with": sorted({(r.addresses, r.device) for r in with_gpu}),
                            "without": sorted({(r.addresses, r.device) for r in without})}))
spark.stop()
"""


def test_the_embedding_stage_runs_on_the_gpu_spark_assigns_and_falls_back_to_the_cpu(tmp_path):
    import torch

    fake = tmp_path / "fake_gpu.sh"
    fake.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["3"]}\'\n')
    fake.chmod(0o755)
    worker_opts = f"-Dspark.worker.resource.gpu.amount=1 -Dspark.worker.resource.gpu.discoveryScript={fake}"
    with StandaloneCluster(tmp_path, worker_opts=worker_opts) as cluster:
        from include.spark import spark_conf

        cfg = SolarisConfig().with_overrides(lake={"root": str(tmp_path / "lake")},
                                             spark={"master": cluster.url, "executor_gpus": 1,
                                                    "gpu_discovery_script": str(fake)})
        conf = {k: v for k, v in spark_conf(cfg).items() if k.startswith("spark.executor.resource.")}
        assert conf == {"spark.executor.resource.gpu.amount": "1",
                        "spark.executor.resource.gpu.discoveryScript": str(fake)}
        out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(conf), cluster.url, str(cfg.spark.task_gpus)],
                             cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.split("RESULT ", 1)[1])
    on_gpu = "cuda:3" if torch.cuda.is_available() else "cpu"
    assert result["with"] == [["3", on_gpu]]  # Spark assigned the worker's GPU; no CUDA here: the CPU
    assert result["without"] == [["", "fallback"]]  # the other stages hold no GPU


@pytest.mark.parametrize("spark, message", [
    ({"executor_gpus": 1}, "needs a cluster master"),
    ({"master": "spark://m:7077", "executor_gpus": 1, "task_gpus": 1.5}, "task_gpus"),
    ({"master": "spark://m:7077", "executor_gpus": -1}, "executor_gpus"),
])
def test_gpu_dispatch_settings_that_cannot_work_are_refused(spark, message):
    with pytest.raises(ConfigError, match=message):
        SolarisConfig().with_overrides(spark=spark)
