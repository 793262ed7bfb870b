"""Hourly cycles over a range of request time, in order: the entry point for large backfills and replays.

    python -m spark_jobs.backfill --start 2026-01-05T06:00:00 --end 2026-01-05T12:00:00 [--step-hours 1]
    spark-submit --master spark://host:7077 --properties-file lake/spark-solaris.conf \\
        spark_jobs/backfill.py --start ... --end ...

``--start S --end E`` is the half-open range [S, E) of request time, as on every entry point: the
cycles run at t = S + step, S + 2 step, ..., E, the interval of each being [t - step, t), each exactly as the hourly cycle does it
(spark_jobs/cycle.py: resolve the past step's requests, precompute, user means, neighbors,
publish; ``--stages`` picks a subset), in one Spark application. A failed run stops the backfill; runs before it stay committed and rerunning
the range redoes them idempotently.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from spark_jobs import cycle


def interval_ends(start, end, step_hours: float) -> list:
    if step_hours <= 0:
        raise ValueError("step-hours must be > 0")
    if end < start:
        raise ValueError(f"empty range: end {end} is before start {start}")
    out, t = [], start
    while t <= end:
        out.append(t)
        t += timedelta(hours=step_hours)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.backfill", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", required=True, help="first request time (UTC, ISO), inclusive")
    p.add_argument("--end", required=True, help="last request time (UTC, ISO), exclusive: the last cycle's t")
    p.add_argument("--step-hours", type=float, default=1.0)
    p.add_argument("--stages", default=",".join(cycle.STAGES), help="comma-separated subset of: %(default)s")
    p.add_argument("--record-misses", action="store_true", help="queue candidates served without their exact "
                                                                 "embedding (as the online lookup does)")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.cli import parse_time
    from include.config import load_config
    from include.spark import get_spark

    stages = tuple(s.strip() for s in a.stages.split(",") if s.strip())
    start, end = parse_time(a.start), parse_time(a.end)
    if end <= start:
        p.error(f"empty range: --end {a.end} is not after --start {a.start}")
    ends = interval_ends(start + timedelta(hours=a.step_hours), end, a.step_hours)
    cfg = load_config(a.config)
    spark = get_spark(cfg)
    for i, t in enumerate(ends, 1):
        print(f"[{i}/{len(ends)}] interval ending {t.isoformat()}", flush=True)
        cycle.run(spark, cfg, t, a.step_hours, stages, a.record_misses, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
