"""Where an ingest's time goes: the click-log ingest on a slice of the Globo log, sampled with py-spy.

    pip install py-spy   # not a dependency of the project
    python benchmarks/profile_ingest.py [--input GLOB] [--lake benchmarks/out/profile_lake] [--rate 20]

It runs a bare scan and count of the input, then the ingest into an empty lake, in one Spark session
(local[2]), under ``py-spy record --idle``. The driver is Python waiting on the JVM, so each sample's
innermost frame in this project's code says which step of the job the time went to (Spark is lazy:
a cached DataFrame is computed at its first action, so candidate generation shows up where the
requests are first read). Prints the scan and ingest seconds and a table of seconds per step.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOBO = ROOT.parent / "shared" / "datasets" / "globo_news_clicks" / "clicks"
PROJECT_FRAME = re.compile(r"(\S+) \(((?:spark_jobs|feature_store|include|model)/[\w/]+\.py):(\d+)\)")


def run(input_glob: str, lake: str) -> None:
    """The profiled process: a scan, then the ingest, with their seconds."""
    sys.path.insert(0, str(ROOT))
    from include.config import SolarisConfig
    from include.spark import get_spark
    from spark_jobs import ingest_clicklog

    cfg = SolarisConfig().with_overrides(lake={"root": lake}, spark={"master": "local[2]", "driver_memory": "8g"})
    spark = get_spark(cfg)
    t = time.perf_counter()
    records = spark.read.option("header", True).csv(input_glob).count()
    scan = time.perf_counter() - t
    spec = ingest_clicklog.spec_from_args(ingest_clicklog.parse_args(["--input", input_glob, "--preset", "globo"]), cfg)
    t = time.perf_counter()
    report = ingest_clicklog.ingest(spark, cfg, input_glob, spec)
    ingest = time.perf_counter() - t
    print(f"RESULT records={records} request_rows={report.request_rows} scan_s={scan:.1f} ingest_s={ingest:.1f}")


def steps(raw: Path, rate: int) -> list[tuple[str, float]]:
    """Seconds per innermost project frame, over the samples of the main thread's work."""
    seconds = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "profile_ingest.py" not in frames[0]:
            continue  # other threads (py4j's callback server, Spark's progress)
        key = "(outside the project: imports, argument parsing)"
        for frame in frames:
            m = PROJECT_FRAME.match(frame)
            if m:
                key = f"{m.group(2)}:{m.group(3)} {m.group(1)}"
        seconds[key] += int(count) / rate
    return seconds.most_common()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=str(GLOBO / "clicks_hour_0[0-4]?.csv.gz"), help="default: Globo's first 50 hours")
    p.add_argument("--lake", default=str(ROOT / "benchmarks" / "out" / "profile_lake"))
    p.add_argument("--rate", type=int, default=20, help="py-spy samples per second")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        run(a.input, a.lake)
        return 0
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("error: py-spy is needed (pip install py-spy)", file=sys.stderr)
        return 2
    shutil.rmtree(a.lake, ignore_errors=True)
    raw = Path(a.lake).with_name("profile_ingest.raw")
    raw.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([py_spy, "record", "--idle", "--rate", str(a.rate), "--format", "raw", "-o", str(raw), "--",
                           sys.executable, __file__, "--child", "--input", a.input, "--lake", a.lake],
                          capture_output=True, text=True)
    result = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or result is None:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        return 1
    got = dict(kv.split("=") for kv in result.split()[1:])
    scan, ingest = float(got["scan_s"]), float(got["ingest_s"])
    print(f"input: {a.input}\nrecords {int(got['records']):,}, request rows out {int(got['request_rows']):,}; "
          f"scan {scan:.1f} s, ingest {ingest:.1f} s ({ingest / scan:.1f}x the scan)\n")
    rows = steps(raw, a.rate)
    total = sum(s for _, s in rows)
    print("| step (innermost frame of this project) | seconds | share |\n|---|---:|---:|")
    for key, s in rows:
        if s >= 0.5:
            print(f"| `{key}` | {s:.1f} | {100 * s / total:.1f}% |")
    print(f"| all samples of the main thread | {total:.1f} | 100% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
