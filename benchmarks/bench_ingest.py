"""Ingestion throughput on real logs: the full Globo click log and the MIND subset, on local[2].

    python benchmarks/bench_ingest.py [--globo PATH_GLOB] [--mind DIR] [--lake benchmarks/out/lake]

For each input it measures, in the same Spark session:
- scan: a plain Spark read of the input and a count (the floor any ingest pays), and
- ingest: the full job (parse, quarantine, candidate generation, great-expectations checks,
  Delta writes),
and prints rows in / out / quarantined, seconds, rows/s and the ingest/scan time ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--globo", default=str(SHARED / "globo_news_clicks" / "clicks" / "*.csv.gz"))
    p.add_argument("--mind", default=str(SHARED / "mind_small_subset"))
    p.add_argument("--lake", default=str(ROOT / "benchmarks" / "out" / "lake"))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--skip-globo", action="store_true")
    a = p.parse_args(argv)

    from include.config import SolarisConfig
    from include.spark import get_spark
    from spark_jobs import ingest_clicklog, ingest_mind

    shutil.rmtree(a.lake, ignore_errors=True)
    cfg = SolarisConfig().with_overrides(lake={"root": a.lake}, spark={"master": a.master, "driver_memory": "8g"})
    spark = get_spark(cfg)
    results = []

    def bench(name, scan, ingest):
        t = time.perf_counter()
        scanned = scan()
        scan_s = time.perf_counter() - t
        t = time.perf_counter()
        r = ingest()
        ingest_s = time.perf_counter() - t
        results.append(dict(input=name, records_in=r.records_in, scanned=scanned, request_rows=r.request_rows,
                            requests=r.requests, quarantined=r.quarantined, scan_s=round(scan_s, 1),
                            ingest_s=round(ingest_s, 1), records_per_s=round(r.records_in / ingest_s),
                            rows_out_per_s=round(r.request_rows / ingest_s), ratio=round(ingest_s / scan_s, 1)))
        print(json.dumps(results[-1]), flush=True)

    mind_dir = Path(a.mind)
    if mind_dir.is_dir():
        beh, news = str(mind_dir / "behaviors.tsv"), str(mind_dir / "news.tsv")
        bench("MIND subset (behaviors.tsv)", lambda: spark.read.text(beh).count(),
              lambda: ingest_mind.ingest(spark, cfg, beh, news))
    if not a.skip_globo:
        args = ingest_clicklog.parse_args(["--input", a.globo, "--preset", "globo"])
        spec = ingest_clicklog.spec_from_args(args, cfg)
        bench("Globo click log (385 hourly csv.gz)",
              lambda: spark.read.option("header", True).csv(a.globo).count(),
              lambda: ingest_clicklog.ingest(spark, cfg, a.globo, spec))

    print(f"\nmachine: {platform.machine()}, {__import__('os').cpu_count()} cores, Spark {a.master}, "
          f"Python {platform.python_version()}")
    head = ["input", "records in", "request rows out", "quarantined", "scan s", "ingest s", "records/s",
            "rows out/s", "ingest/scan"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in results:
        print(f"| {r['input']} | {r['records_in']:,} | {r['request_rows']:,} | {r['quarantined']:,} | {r['scan_s']} | "
              f"{r['ingest_s']} | {r['records_per_s']:,} | {r['rows_out_per_s']:,} | {r['ratio']}x |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
