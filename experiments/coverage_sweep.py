"""How coverage moves with the precompute budget and the embedding TTL: one replay of hourly cycles
per setting, with the jobs the hourly DAG runs (spark_jobs/cycle.py: resolve, precompute, user
means, neighbors, publish), then the coverage by tier of the requests served in the measured hours.

    python -m experiments.coverage_sweep --start 2017-10-08T00:00:00 --end 2017-10-08T16:00:00 \\
        --measure-from 2017-10-08T08:00:00 --budgets 0.05,0.1,0.2,0.4 --ttls 1,6,24

The lake must hold an ingested log and trained models (e.g. ``python -m spark_jobs.pipeline --data
globo --input ... --precompute-hours 0``). Each setting replays in a lake of its own under
``<lake>/sweeps/<setting>/`` (its own database, serving tables, miss queue and publications) whose
input tables are the base lake's, registered by location and only read; so settings never see
each other's embeddings and a rerun of a setting redoes it idempotently. Results land in
``coverage_sweep`` of the base database and are printed as a table. By default the settings form a
cross through the configured point (every budget at the configured TTL, every TTL at the configured
budget); ``--grid full`` runs every combination.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import functions as F

from feature_store import lake
from feature_store.resolution import ORDER
from feature_store.tables import (COVERAGE_SWEEP, ITEMS, PRECOMPUTE_RUNS, REQUEST_LOG, USER_EVENTS, conform,
                                  ensure_tables, qualified_name)

INPUTS = (REQUEST_LOG, USER_EVENTS, ITEMS)  # read by the cycle, never written


@dataclass(frozen=True)
class SweepPoint:
    budget: float
    ttl_hours: float

    def __post_init__(self):
        if not 0 < self.budget <= 1:
            raise ValueError(f"budget must be in (0, 1], got {self.budget}")
        if self.ttl_hours <= 0:
            raise ValueError(f"TTL must be > 0 hours, got {self.ttl_hours}")

    @property
    def name(self) -> str:
        return f"budget{self.budget:g}_ttl{self.ttl_hours:g}h"


def sweep_points(budgets: list[float], ttls: list[float], budget: float, ttl: float, grid: str) -> list[SweepPoint]:
    """The settings to replay, each once, in a stable order."""
    if grid == "full":
        pts = [SweepPoint(b, t) for t in ttls for b in budgets]
    elif grid == "cross":
        pts = [SweepPoint(b, ttl) for b in budgets] + [SweepPoint(budget, t) for t in ttls]
    else:
        raise ValueError(f"grid must be 'cross' or 'full', got {grid!r}")
    return list(dict.fromkeys(pts))


def point_config(cfg, p: SweepPoint, folder: str = "sweeps", tag: str = "sweep"):
    """The config of one setting's lake (``<lake>/<folder>/<setting>``, database
    ``<db>_<tag>_<setting>``): own root and database, the base lake's models."""
    db = f"{cfg.lake.database}_{tag}_{re.sub(r'[^0-9a-z]+', '_', p.name.lower())}"
    return cfg.with_overrides(lake={"root": str(cfg.lake.root_path / folder / p.name), "database": db},
                              precompute={"budget": p.budget, "ttl_hours": p.ttl_hours},
                              models={"root": str(cfg.models_root)})


def register_inputs(spark, cfg, pcfg) -> None:
    """Make the base lake's input tables readable by name in the setting's database.

    A setting whose folder was deleted starts anew: its catalog entries, which would point at the
    missing tables, are dropped first (the base lake's tables are only ever referenced, not owned).
    """
    if not pcfg.lake.root_path.exists() and spark.catalog.databaseExists(pcfg.lake.database):
        # SHOW TABLES, not catalog.listTables: that one resolves each Delta table and fails on the missing ones
        for row in spark.sql(f"SHOW TABLES IN {pcfg.lake.database}").collect():
            spark.sql(f"DROP TABLE IF EXISTS {pcfg.lake.database}.{row.tableName}")  # external: data untouched
        spark.sql(f"DROP DATABASE IF EXISTS {pcfg.lake.database}")
    from include.spark import ensure_database

    locations = {spec: cfg.lake.table_path(spec.name) for spec in INPUTS}
    for location in locations.values():
        if not (location / "_delta_log").is_dir():
            raise FileNotFoundError(f"{location} is not a Delta table: ingest a log into {cfg.lake.root_path} first")
    ensure_database(spark, pcfg)
    for spec, location in locations.items():
        spark.sql(f"CREATE TABLE IF NOT EXISTS {qualified_name(spec, pcfg.lake.database)} USING DELTA "
                  f"LOCATION '{location}'")


def replay(spark, cfg, p: SweepPoint, ends: list[datetime], measure_from: datetime, record_misses: bool = False,
           log=print, pcfg=None) -> list[dict]:
    """Replay the cycles at ``ends`` for one setting; its coverage_sweep rows. ``record_misses``
    queues every candidate served without its exact embedding, as the online lookup does.
    ``pcfg``: the setting's config when not ``point_config(cfg, p)``."""
    from spark_jobs import coverage, cycle

    pcfg = pcfg or point_config(cfg, p)
    register_inputs(spark, cfg, pcfg)
    started = time.perf_counter()
    for i, t in enumerate(ends, 1):
        log(f"  [{p.name}] cycle {i}/{len(ends)} at {t}")
        cycle.run(spark, pcfg, t, record_misses=record_misses, log=lambda *_: None)
    seconds = round(time.perf_counter() - started, 1)
    rows = [r for r in coverage.run(spark, pcfg, measure_from, ends[-1]) if r[0] == "all"]
    runs = (spark.table(qualified_name(PRECOMPUTE_RUNS, pcfg.lake.database))
            .where(F.col("interval_end").between(F.lit(ends[0]), F.lit(ends[-1])))
            .agg(F.sum("pairs_embedded").alias("embedded"), F.sum("pairs_scored").alias("scored")).first())
    return [{"point": p.name, "budget": p.budget, "ttl_hours": p.ttl_hours, "replay_start": ends[0],
             "interval_start": measure_from, "interval_end": ends[-1], "tier": tier, "pairs": pairs,
             "share": float(share or 0.0), "fm_inferences": int(runs.embedded or 0),
             "pairs_scored": int(runs.scored or 0), "cycles": len(ends), "seconds": seconds}
            for _, tier, pairs, share in rows]


def save(spark, cfg, rows: list[dict]) -> None:
    """Replace this setting's rows for the same replay and measured interval."""
    ensure_tables(spark, cfg, (COVERAGE_SWEEP,))
    r = rows[0]
    where = (f"point = '{r['point']}' AND replay_start = '{r['replay_start']}' "
             f"AND interval_start = '{r['interval_start']}' AND interval_end = '{r['interval_end']}'")
    df = conform(spark.createDataFrame(rows, COVERAGE_SWEEP.schema()), COVERAGE_SWEEP)
    lake.replace(cfg, COVERAGE_SWEEP, df, where)


def table(rows: list[dict]) -> str:
    """Markdown: one row per setting and measured interval: tier shares, then work per hour (FM
    inferences and verifier scores over the whole replay, served candidates over the measured hours)."""
    by: dict[tuple, dict] = {}
    for r in rows:
        key = (r["point"], str(r["replay_start"]), str(r["interval_start"]), str(r["interval_end"]))
        by.setdefault(key, {"r": r, "share": {}, "pairs": 0})
        by[key]["share"][r["tier"]] = r["share"]
        by[key]["pairs"] += r["pairs"]
    lines = ["| measured | budget | TTL | " + " | ".join(ORDER) + " | all but none | FM inferences / h "
             "| verifier scores / h | served candidates / h |", "|---|---:|---:|" + "---:|" * (len(ORDER) + 4)]
    for v in sorted(by.values(), key=lambda v: (str(v["r"]["interval_start"]), v["r"]["ttl_hours"], v["r"]["budget"])):
        r, s = v["r"], {t: v["share"].get(t, 0.0) for t in ORDER}
        hours = (r["interval_end"] - r["interval_start"]).total_seconds() / 3600
        lines.append(f"| {r['interval_start']:%Y-%m-%d %H:%M}..{r['interval_end']:%H:%M} | {100 * r['budget']:g}% | {r['ttl_hours']:g} h | "
                     + " | ".join(f"{100 * s[t]:.1f}%" for t in ORDER)
                     + f" | {100 * (1 - s['none']):.1f}% | {r['fm_inferences'] / r['cycles']:,.0f} "
                       f"| {r['pairs_scored'] / r['cycles']:,.0f} | {v['pairs'] / hours:,.0f} |")
    return "\n".join(lines)


def saved(spark, cfg) -> list[dict]:
    """Every row of ``coverage_sweep``, as dicts."""
    ensure_tables(spark, cfg, (COVERAGE_SWEEP,))
    return [r.asDict() for r in spark.table(qualified_name(COVERAGE_SWEEP, cfg.lake.database)).collect()]


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from e


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.coverage_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", help="first cycle's t (UTC, ISO)")
    p.add_argument("--end", help="requests [start, end) are served by the replay: cycles run at every hour from start to end")
    p.add_argument("--measure-from",
                   help="coverage counts requests in [measure-from, end): leave the first hours to warm up")
    p.add_argument("--budgets", type=floats, default=[0.05, 0.1, 0.2, 0.4])
    p.add_argument("--ttls", type=floats, default=[1.0, 6.0, 24.0], help="pair-embedding TTLs in hours")
    p.add_argument("--grid", choices=["cross", "full"], default="cross")
    p.add_argument("--record-misses", action="store_true",
                   help="queue the candidates served without their exact embedding for the next cycle, as the lookup does")
    p.add_argument("--config", help="SOLARIS TOML config (the base lake)")
    p.add_argument("--report", action="store_true", help="print the saved results only; run nothing")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.cli import parse_time
    from include.config import load_config
    from include.spark import get_spark
    from spark_jobs.backfill import interval_ends

    if a.report:
        cfg = load_config(a.config)
        print(table(saved(get_spark(cfg), cfg)))
        return 0
    if not (a.start and a.end and a.measure_from):
        p.error("--start, --end and --measure-from are required (or --report)")
    start, end, measure_from = parse_time(a.start), parse_time(a.end), parse_time(a.measure_from)
    if not start < measure_from < end:
        p.error("need start < measure-from < end: the measured hours come after the first cycle")
    cfg = load_config(a.config)
    points = sweep_points(a.budgets, a.ttls, cfg.precompute.budget, cfg.precompute.ttl_hours, a.grid)
    spark = get_spark(cfg)
    ends = interval_ends(start, end, 1.0)
    done: list[dict] = []
    for i, pt in enumerate(points, 1):
        print(f"[{i}/{len(points)}] {pt.name}: {len(ends)} cycles {ends[0]} .. {ends[-1]}", flush=True)
        rows = replay(spark, cfg, pt, ends, measure_from, a.record_misses)
        save(spark, cfg, rows)
        done += rows
        print(table(rows).splitlines()[-1], f"({rows[0]['seconds']:.0f} s)", flush=True)
    print(f"\ncoverage of the requests in [{measure_from}, {end}) after replaying from {start}:")
    print(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
