"""A Spark driver's start with and without the class-data sharing archive (include/class_data.py).

    python benchmarks/bench_class_data.py [--rounds 3]

Each round runs the SQL entry point as a user does, `python -m include.sql "SHOW DATABASES"`, on a
fresh lake (a new JVM: session with Delta and the embedded metastore, then one query), once with
`[spark] class_data_sharing = false` and once with the archive, in alternating order so that a
machine's load falls on both. Prints a Markdown table of wall seconds (median and every round) and
the ratio. Builds the archive first if this machine has none (`make install` does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_start(sharing: bool, work: Path) -> float:
    """Wall seconds of one `python -m include.sql` on an empty lake of its own."""
    lake = Path(tempfile.mkdtemp(dir=work))
    config = lake / "bench.toml"
    config.write_text(f"[spark]\nmaster = \"local[2]\"\nclass_data_sharing = {str(sharing).lower()}\n")
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake / "lake")}
    started = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "include.sql", "SHOW DATABASES", "--config", str(config)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    if p.returncode != 0:
        raise SystemExit(f"include.sql failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from include import class_data

    if class_data.build() is None:  # builds it unless this machine has it whole
        raise SystemExit("no Java runtime found: Spark needs Java 17")
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            for sharing in ((False, True) if r % 2 == 0 else (True, False)):
                times[sharing].append(one_start(sharing, Path(work)))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"`python -m include.sql \"SHOW DATABASES\"` on an empty lake, {args.rounds} rounds, {os.cpu_count()} cores\n")
    print("| driver JVM | median s | rounds (s) | ratio to no archive |\n|---|---:|---|---:|")
    for name, sharing, med in (("no archive", False, off), ("class-data archive", True, on)):
        print(f"| {name} | {med:.1f} | {', '.join(f'{s:.1f}' for s in times[sharing])} | {med / off:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
