"""Small click-log ingests in one warm Spark session, this checkout against another version.

    python benchmarks/bench_small_ingest.py [--against REF] [--rounds 2]

What the test suite and a trickle of small hourly files pay per ingest: each round starts one
session (local[2]) on a lake of its own and ingests three 60-click CSV files with
`spark_jobs.ingest_clicklog.ingest`: a first input, a second input of other users in the same
hours, and the second again (a rerun). Every ingest runs in a Spark job group of its own, so its
Spark jobs are counted exactly (``statusTracker``): a count that does not depend on the machine's
load. With ``--against REF`` the same rounds run in a git worktree of REF, alternating with this
checkout so that a machine's load falls on both. Prints a Markdown table: median wall seconds of
the two warm ingests (the second and third of a round), Spark jobs per ingest, ratios to REF.
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
HEADER = "user_id,item_id,ts,click,position,category,subcategory"
HOUR0_MS = 1767571200000  # 2026-01-05T00:00:00Z


def write_inputs(folder: Path) -> list[Path]:
    """Two 60-click inputs over the same hours, other users; the second is ingested twice."""
    a, b = folder / "a.csv", folder / "b.csv"
    a.write_text("\n".join([HEADER] + [f"u{n % 7},i{n % 5},{HOUR0_MS + n * 120_000},1,0,3,1" for n in range(60)]) + "\n")
    b.write_text("\n".join([HEADER] + [f"v{n % 7},i{n % 5},{HOUR0_MS + 90 * 60_000 + n * 60_000},1,0,3,1"
                                       for n in range(60)]) + "\n")
    return [a, b, b]


def worker() -> None:
    """One round in this process's checkout (the working directory): prints a JSON line of
    [seconds, jobs] per ingest."""
    sys.path.insert(0, os.getcwd())
    from include.config import SolarisConfig
    from include.spark import ensure_database, get_spark
    from spark_jobs import ingest_clicklog as ic

    folder = Path(tempfile.mkdtemp())
    cfg = SolarisConfig().with_overrides(
        lake={"root": str(folder / "lake"), "database": "bench"},
        spark={"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g"},
        clicklog={"negatives_per_click": 2, "pool_size": 20})
    spark = get_spark(cfg)
    ensure_database(spark, cfg)
    out = []
    for i, path in enumerate(write_inputs(folder)):
        spec = ic.spec_from_args(ic.parse_args(["--input", str(path)]), cfg)
        spark.sparkContext.setJobGroup(f"ingest{i}", f"ingest {path.name}")
        started = time.perf_counter()
        ic.ingest(spark, cfg, str(path), spec)
        seconds = time.perf_counter() - started
        out.append([seconds, len(spark.sparkContext.statusTracker().getJobIdsForGroup(f"ingest{i}"))])
    spark.stop()
    print("RESULT " + json.dumps(out))


def one_round(checkout: Path) -> list[list[float]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker"], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"the round in {checkout} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="a git revision to compare with (run from a worktree of it)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker()
        return 0
    with tempfile.TemporaryDirectory() as work:
        checkouts = {"this checkout": ROOT}
        if args.against:
            tree = Path(work) / "against"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.against],
                           check=True)
            checkouts = {args.against: tree, **checkouts}
        try:
            rounds = {name: [] for name in checkouts}
            for r in range(args.rounds):
                for name in (list(checkouts) if r % 2 == 0 else list(reversed(checkouts))):
                    rounds[name].append(one_round(checkouts[name]))
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"three 60-click ingests per round in one local[2] session, {args.rounds} rounds, {os.cpu_count()} cores\n")
    print("| version | warm ingest, median s | every ingest (s) | Spark jobs per ingest | s ratio | jobs ratio |\n"
          "|---|---:|---|---|---:|---:|")
    base = None
    for name, runs in rounds.items():
        warm = statistics.median(s for run in runs for s, _ in run[1:])
        jobs = statistics.median(j for run in runs for _, j in run[1:])
        base = base or (warm, jobs)
        every = " / ".join(", ".join(f"{s:.1f}" for s, _ in run) for run in runs)
        counts = " / ".join(", ".join(str(j) for _, j in run) for run in runs)
        print(f"| {name} | {warm:.1f} | {every} | {counts} | {warm / base[0]:.2f} | {jobs / base[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
