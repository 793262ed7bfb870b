"""Consecutive hourly cycles over the whole Globo click log, with the seconds of every stage.

    python benchmarks/bench_hourly_cycles.py [--input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz']
        [--lake benchmarks/out/hourly_lake] [--start 2017-10-10T00:00] [--hours 24] [--reuse]

1. ingests the whole log (every click, no sampling) with the main job (``spark_jobs.pipeline
   --models none --precompute-hours 0``), timed;
2. trains the quick model set on the requests before ``--start`` (``model.training.train_all``;
   it samples its training requests, so this costs minutes, not the log's size);
3. runs the hourly cycle (``spark_jobs.cycle``: resolve the past hour's requests as of their
   timestamps with misses queued as the lookup does, precompute, user means, neighbors, publish)
   at every hour t = start + 1 h, ..., start + ``--hours`` h, in one Spark session as a backfill
   does, and records each stage's wall time and the work it did.

Writes ``<lake>/../hourly_cycles.json`` after every cycle (a stopped run keeps what it measured)
and prints a Markdown table of the cycles with the median and maximum per stage. ``--reuse``
keeps the lake and models of an earlier run and replays the cycles again: a cycle rerun over the
same hour is idempotent (each table write is one Delta transaction keyed by its run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOBO = ROOT.parent / "shared" / "datasets" / "globo_news_clicks" / "clicks" / "*.csv.gz"


def ingest(lake: Path, input_glob: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "spark_jobs.pipeline", "--data", "globo", "--input", input_glob,
                    "--models", "none", "--precompute-hours", "0", "--reports", str(lake.parent / "reports")],
                   cwd=ROOT, check=True, env={**os.environ, "SOLARIS_LAKE_ROOT": str(lake)})
    return time.perf_counter() - t0


def table(cycles: list[dict], stages: tuple[str, ...]) -> str:
    head = ["cycle t", "rows resolved", "pairs scored", "pairs embedded", "users with neighbors",
            "neighbor FM passes", "whole-index searches",
            *[f"{s} s" for s in stages], "cycle s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cycles:
        w = c["work"]
        lines.append("| " + " | ".join([c["t"][5:16], f"{w['resolved']:,}", f"{w['scored']:,}", f"{w['embedded']:,}",
                                         f"{w['neighbors']:,}", f"{w.get('fm_passes', w['neighbors']):,}",
                                         f"{w.get('whole_index', w['neighbors']):,}",
                                         *[f"{c['seconds'][s]:.1f}" for s in stages],
                                         f"{c['cycle_s']:.1f}"]) + " |")
    for name, f in (("median", statistics.median), ("max", max)):
        lines.append("| " + " | ".join([f"**{name}**", "", "", "", "", "", "",
                                         *[f"**{f([c['seconds'][s] for c in cycles]):.1f}**" for s in stages],
                                         f"**{f([c['cycle_s'] for c in cycles]):.1f}**"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=str(GLOBO), help="the Globo click log (a glob of the hourly csv.gz files)")
    p.add_argument("--lake", default=str(ROOT / "benchmarks" / "out" / "hourly_lake"))
    p.add_argument("--start", default="2017-10-10T00:00", help="train before it; the first cycle is an hour after")
    p.add_argument("--hours", type=int, default=24, help="consecutive hourly cycles")
    p.add_argument("--reuse", action="store_true", help="keep the lake and models of an earlier run")
    a = p.parse_args(argv)
    if a.hours < 1:
        p.error("--hours must be at least 1")
    lake = Path(a.lake).resolve()
    fresh = not (a.reuse and lake.exists())  # ingest (and train) into an empty lake
    if fresh and not glob.glob(a.input):
        p.error(f"no file matches --input {a.input} (the Globo log is in ../shared/datasets; see its README)")
    start = datetime.fromisoformat(a.start)
    out_file = lake.parent / "hourly_cycles.json"
    os.environ["SOLARIS_LAKE_ROOT"] = str(lake)

    from include.config import load_config
    from model import training

    cfg = load_config(None)
    result: dict = {"input": a.input, "start": start.isoformat(), "hours": a.hours}
    if fresh:
        shutil.rmtree(lake, ignore_errors=True)
        result["ingest_s"] = round(ingest(lake, a.input), 1)
        print(f"ingest: {result['ingest_s']} s", flush=True)
    if fresh or not cfg.models_root.exists():
        t0 = time.perf_counter()
        training.train_all(cfg, "globo", training.model_set("quick"), until=start, log=lambda s: print(s, flush=True))
        result["train_s"] = round(time.perf_counter() - t0, 1)
        print(f"train: {result['train_s']} s", flush=True)

    from include.spark import get_spark
    from spark_jobs import cycle

    spark = get_spark(cfg)
    result["log"] = {"clicks": spark.table(f"{cfg.lake.database}.user_events").count(),
                     "request_rows": spark.table(f"{cfg.lake.database}.request_log").count()}
    print(f"lake: {result['log']}", flush=True)
    result["cycles"] = []
    for i in range(1, a.hours + 1):
        t = start + timedelta(hours=i)
        print(f"[{i}/{a.hours}] cycle at {t.isoformat()}", flush=True)
        out = cycle.run(spark, cfg, t, record_misses=True, log=lambda s: print(s, flush=True))
        pre, res, nb = out["precompute"], out["resolve"], out["user_neighbors"]
        result["cycles"].append({
            "t": t.isoformat(), "seconds": out["seconds"], "cycle_s": round(sum(out["seconds"].values()), 2),
            "work": {"resolved": int(res["candidates"]), "scored": int(pre["pairs_scored"]),
                     "embedded": int(pre["pairs_embedded"]), "neighbors": int(nb["users_with_neighbors"]),
                     # the FM user passes and whole-index searches of an incremental build (all users before it)
                     "fm_passes": int(nb.get("vectors_computed", nb["users_represented"])),
                     "whole_index": int(nb.get("searched_whole_index", nb["users_represented"]))},
            "counters": {k: v for k, v in out.items() if k != "seconds"}})
        out_file.write_text(json.dumps(result, indent=1, default=str))
    print(table(result["cycles"], cycle.STAGES))
    print(f"\nwritten: {out_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
