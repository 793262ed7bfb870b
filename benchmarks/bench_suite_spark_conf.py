"""Hourly cycles on the test suite's shared world with Spark's defaults and with the suite's settings
(``tests/conftest.py`` ``TEST_SPARK_CONF``: interpreted expressions, short plan strings).

    python benchmarks/bench_suite_spark_conf.py [--rounds 1] [--cycles 5]

Builds the world the suite's ``base_lake`` builds (the tiny synthetic impression log ingested and
the TINY model set trained on it), then, per round and arm in alternating order, copies it into a
lake of its own and runs ``--cycles`` hourly cycles (2026-01-05 03:00 on) in a new driver process
with that arm's settings: a cold first cycle, then warm ones. Prints a Markdown table of wall
seconds (the first cycle, the mean of the warm ones, the process's total) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("Spark's defaults", "the suite's settings")


def build_world(work: Path) -> None:
    """The shared lake of the suite (tests/conftest.py ``base_lake``) under ``work/base``."""
    from include.spark import get_spark
    from tests.conftest import _test_config, build_base_lake

    spark = get_spark(_test_config(work / "base", database="t_base"))
    build_base_lake(spark, work / "base", work / "log")
    spark.stop()


def run_cycles(work: Path, name: str, suite_settings: bool, cycles: int) -> dict:
    """In this process (a new driver): copy the world, run the cycles; their wall seconds."""
    from datetime import datetime

    from include.config import spark_properties
    from include.spark import get_spark
    from spark_jobs import cycle
    from tests.conftest import TEST_SPARK_CONF, _test_config, copy_lake

    base = _test_config(work / "base", database="t_base")
    cfg = _test_config(work / name, database=f"t_{name}").with_overrides(
        spark={"extra": spark_properties(TEST_SPARK_CONF) if suite_settings else {}})
    started = time.perf_counter()
    spark = get_spark(cfg)
    copy_lake(spark, base, cfg)
    seconds = []
    for hour in range(3, 3 + cycles):
        t0 = time.perf_counter()
        cycle.run(spark, cfg, datetime(2026, 1, 5, hour), 1.0, cycle.STAGES, False, log=lambda *_: None)
        seconds.append(time.perf_counter() - t0)
    spark.stop()
    return {"cycles": seconds, "total": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: one arm's driver process
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.arm is not None:
        name, settings = args.arm.split(":")
        print(json.dumps(run_cycles(Path(args.work), name, settings == "1", args.cycles)))
        return 0
    if args.cycles < 2:
        p.error("--cycles must be at least 2 (a cold cycle and a warm one)")
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks."
                        f"bench_suite_spark_conf import build_world; from pathlib import Path; build_world(Path({tmp!r}))"],
                       cwd=ROOT, check=True)
        for r in range(args.rounds):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                out = subprocess.run([sys.executable, __file__, "--arm", f"r{r}a{i}:{i}", "--work", tmp,
                                      "--cycles", str(args.cycles)], cwd=ROOT, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"arm {ARMS[i]} failed:\n{out.stderr[-3000:]}")
                results[ARMS[i]].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def medians(arm):
        rs = results[arm]
        return (statistics.median(r["cycles"][0] for r in rs),
                statistics.median(statistics.mean(r["cycles"][1:]) for r in rs),
                statistics.median(r["total"] for r in rs))

    base = medians(ARMS[0])
    print(f"{args.cycles} hourly cycles on the suite's shared world, {args.rounds} round(s), {os.cpu_count()} cores\n")
    print("| Spark settings | first cycle s | warm cycle s (mean) | process s | ratios to the defaults |")
    print("|---|---:|---:|---:|---|")
    for arm in ARMS:
        m = medians(arm)
        print(f"| {arm} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | "
              + " / ".join(f"{a / b:.2f}" for a, b in zip(m, base)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
