"""Command-line plumbing the per-interval Spark jobs share: times as the jobs take them, and the
``--at t [--config F]`` entry point (load the config, start the session, run, print).

One vocabulary for every entry point: ``--at T`` is a run's time t (the end of the hour it
processes); ``--start S --end E`` is always a half-open range [S, E) of request times."""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from typing import Any, Callable


def parse_time(s: str) -> datetime:
    """An ISO time as a naive UTC datetime (the jobs' convention); a zone, if given, is converted."""
    try:
        t = datetime.fromisoformat(s)
    except (TypeError, ValueError) as e:
        raise ValueError(f"not an ISO time: {s!r} (expected e.g. 2026-01-05T12:00:00, UTC)") from e
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t  # naive = UTC throughout


def print_counters(title: str, counters: dict) -> None:
    print(title)
    for k, v in counters.items():
        print(f"  {k:<24} {v:>12,}" if isinstance(v, int) else f"  {k:<24} {v}")


AT_HELP = "the run's time t (UTC, ISO), e.g. 2026-01-05T12:00:00: the run processes the hour before it"


def prog(module: str) -> str:
    """An entry point's name as a user types it: ``python -m spark_jobs.precompute``."""
    return f"python -m {module}"


# Exit status of a job that lost a Delta transaction race to another run writing the same table.
WRITE_CONFLICT = 3


def write_conflict(e: BaseException) -> str | None:
    """Delta's conflict exception and the first line of its message when ``e`` is one (another
    writer committed to the table first, so this transaction was refused whole), else None."""
    m = re.search(r"io\.delta\.exceptions\.(\w*(?:Concurrent|Changed)\w*): ([^\n]*)", str(e))
    return f"{m.group(1)}: {m.group(2)}" if m else None


def run_at_time(argv: list[str] | None, module: str, description: str, run: Callable[[Any, Any, datetime], Any],
                show: Callable[[Any], None]) -> int:
    """``python -m <module> --at t [--config F]``: ``show(run(spark, cfg, t))``."""
    p = argparse.ArgumentParser(prog=prog(module), description=description)
    p.add_argument("--at", required=True, help=AT_HELP)
    p.add_argument("--config", help="SOLARIS TOML config")
    add_verbose(p)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    with_verbose(a)

    from include.config import load_config
    from include.spark import get_spark

    t = parse_time(a.at)
    cfg = load_config(a.config)
    try:
        result = run(get_spark(cfg), cfg, t)
    except Exception as e:
        if (conflict := write_conflict(e)) is None:
            raise
        print(f"error: {prog(module)} --at {a.at} lost a write race: another run committed to the same table first "
              f"({conflict}). Each table write is one Delta transaction, so this run left whole commits or "
              f"none; the stage is idempotent for its interval: rerun it once the other run has finished.",
              file=sys.stderr)
        return WRITE_CONFLICT
    show(result)
    return 0


def add_verbose(parser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="show Spark's warnings too (default: its errors only; SOLARIS_VERBOSE=1 does the same)")


def with_verbose(args) -> None:
    """``--verbose`` reaches the session through the environment, so a Spark job started from this
    process (and spark-submit) sees it too."""
    if getattr(args, "verbose", False):
        os.environ["SOLARIS_VERBOSE"] = "1"


LEAK_OVERRIDE = "--allow-leaking-candidates"


def add_leak_override(parser) -> None:
    """The one flag that lets training go on from a source whose generated candidates failed the
    ingest's leak check (``[quality] allow_leaking_candidates``)."""
    parser.add_argument(LEAK_OVERRIDE, action="store_true",
                        help="train and report even when the click log's generated candidates failed the leak "
                             "check; every figure is then marked and no transfer ratio is printed")


def with_leak_override(cfg, args):
    """``cfg`` with ``[quality] allow_leaking_candidates`` on when the command line asked for it."""
    if getattr(args, "allow_leaking_candidates", False):
        return cfg.with_overrides(quality={"allow_leaking_candidates": True})
    return cfg
