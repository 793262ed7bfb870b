"""Data-quality gates for the hourly DAG, with great-expectations (feature_store/quality.py).

    python -m spark_jobs.validate requests --start 2026-01-05T11:00:00 --end 2026-01-05T12:00:00
    python -m spark_jobs.validate features --at 2026-01-05T12:00:00

``requests``: the request_log rows of [start, end) (keys, labels, time range, candidates per
request, uniqueness). ``features``: what the run at ``end`` wrote (embedding size, no NaN,
expires_at after computed_at, neighbor rows) and the past hour's coverage against
``[quality] min_coverage``. A failure exits non-zero naming each failed expectation with its counts.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from include.cli import AT_HELP, prog

    p = argparse.ArgumentParser(prog=prog("spark_jobs.validate"), description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["requests", "features"])
    p.add_argument("--start", help="requests: first request time (UTC, ISO), inclusive")
    p.add_argument("--end", help="requests: last request time (UTC, ISO), exclusive")
    p.add_argument("--at", help="features: " + AT_HELP)
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from feature_store import quality
    from feature_store.tables import REQUEST_LOG, ensure_tables, in_time_range, qualified_name
    from include.config import load_config
    from include.spark import get_spark
    from include.cli import parse_time

    cfg = load_config(a.config)
    spark = get_spark(cfg)
    if a.what == "requests" and not (a.start and a.end):
        p.error("requests needs --start and --end")
    if a.what == "features" and not a.at:
        p.error("features needs --at")
    try:
        if a.what == "requests":
            start, end = parse_time(a.start), parse_time(a.end)
            ensure_tables(spark, cfg, (REQUEST_LOG,))
            rows = in_time_range(spark.table(qualified_name(REQUEST_LOG, cfg.lake.database)), start, end)
            report = quality.validate_request_log(rows, cfg, f"{start:%Y%m%dT%H%M%S}-{end:%Y%m%dT%H%M%S}")
        else:
            from feature_store.tables import ALL_TABLES
            from model.registry import code_dim

            ensure_tables(spark, cfg, ALL_TABLES)
            report = quality.validate_feature_tables(spark, cfg, parse_time(a.at), code_dim(cfg))
    except quality.DataQualityError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{a.what} passed; report {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
