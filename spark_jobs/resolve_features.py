"""As-of resolution: attach to every logged candidate of [start, end) the embedding and tier it
would have been served at its request time, and write them to ``request_features``.

Each request reads the snapshot published most recently at or before its timestamp (the Delta
versions in ``feature_versions``, read with delta-rs time travel) and the shared rule in
feature_store/resolution.py, the same code the online lookup runs. Inside Spark it is a
``mapInPandas`` over request rows; each Python worker loads a snapshot once and keeps it.
With ``--record-misses`` every candidate served without its exact embedding is queued in
``miss_queue`` (origin 'replay'), as the online lookup does at serving time.

    python -m spark_jobs.resolve_features --start 2026-01-05T11:00:00 --end 2026-01-05T12:00:00
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake
from feature_store.resolution import TIERS
from feature_store.tables import (MISS_QUEUE, REQUEST_FEATURES, REQUEST_LOG, SHADOW_REQUEST_FEATURES, conform,
                                  ensure_tables, in_time_range, qualified_name)


def resolve(requests: DataFrame, publications: list[dict], tables_root: str, dim: int) -> DataFrame:
    """Add tier, embedding, snapshot_run_id and code_version to rows with user_id, item_id, ts; pure
    given the tables."""
    ends = [p["interval_end"] for p in publications]
    versions = [tuple(sorted((k, v) for k, v in p.items() if k.endswith("_version"))) for p in publications]
    run_ids = [p["run_id"] for p in publications]
    code_versions = [p.get("code_version") for p in publications]

    def fn(batches):
        import numpy as np

        from feature_store.resolution import NONE, TIERS, cached_snapshot, to_micros

        end_us = to_micros(ends) if ends else np.zeros(0, np.int64)
        for pdf in batches:
            now = to_micros(pdf["ts"]) if len(pdf) else np.zeros(0, np.int64)
            which = np.searchsorted(end_us, now, side="right") - 1  # newest publication at or before ts
            emb = np.zeros((len(pdf), dim), np.float32)
            tier = np.full(len(pdf), NONE, np.int8)
            for w in np.unique(which[which >= 0]):
                rows = which == w
                snap = cached_snapshot(tables_root, versions[w], dim, run_ids[w])
                emb[rows], tier[rows] = snap.resolve(pdf["user_id"].to_numpy()[rows], pdf["item_id"].to_numpy()[rows],
                                                     pdf["ts"].to_numpy()[rows])
            yield pdf.assign(tier=np.asarray(TIERS, dtype=object)[tier], embedding=list(emb),
                             snapshot_run_id=[run_ids[w] if w >= 0 else None for w in which],
                             code_version=[code_versions[w] if w >= 0 else None for w in which])

    schema = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in requests.schema.fields)
    return requests.mapInPandas(fn, f"{schema}, tier string, embedding array<float>, snapshot_run_id string, "
                                    f"code_version string")


def run(spark, cfg, start: datetime, end: datetime, record_misses: bool = False, dim: int | None = None) -> dict:
    from spark_jobs.publish import published
    from model.registry import code_dim

    if end <= start:
        raise ValueError(f"empty interval: end {end} is not after start {start}")
    started = time.perf_counter()
    db = cfg.lake.database
    ensure_tables(spark, cfg, (REQUEST_LOG, REQUEST_FEATURES, MISS_QUEUE))
    dim = dim or code_dim(cfg)
    pubs = [p for p in published(spark, cfg) if p["interval_end"] < end]
    requests = (in_time_range(spark.table(qualified_name(REQUEST_LOG, db)), start, end)
                .select("request_id", "item_id", "user_id", "ts", "label"))
    rows = conform(resolve(requests, pubs, str(cfg.lake.tables_path), dim).withColumn("date", F.to_date("ts")),
                   REQUEST_FEATURES).persist()
    try:
        by_tier = {r.tier: r["count"] for r in rows.groupBy("tier").count().collect()}
        lake.replace(cfg, REQUEST_FEATURES, rows, f"ts >= '{start}' AND ts < '{end}'")
        queued = 0
        if record_misses:
            misses = (rows.where(F.col("tier") != "exact")
                      .select("user_id", "item_id", F.col("ts").alias("requested_at"), F.lit("replay").alias("origin"),
                              F.lit(None).cast("string").alias("consumed_by_run")).dropDuplicates(
                                  ["user_id", "item_id", "requested_at"]))
            queued = misses.count()
            lake.upsert(spark, cfg, MISS_QUEUE, conform(misses, MISS_QUEUE), update=False)  # a queued miss stays as it is
    finally:
        rows.unpersist()
    shadow_rows = resolve_shadow(spark, cfg, requests, pubs, start, end, dim)
    total = sum(by_tier.values())
    return {"interval": f"{start.isoformat()} .. {end.isoformat()}", "candidates": total,
            **{f"tier_{t}": by_tier.get(t, 0) for t in TIERS},
            # publications before the interval's end; a request reads the newest one before it
            "misses_queued": queued, "snapshots_published": len(pubs),
            # in a rollout: candidates resolved in the new code space too (shadow_request_features)
            **({"shadow_candidates": shadow_rows} if shadow_rows is not None else {}),
            "seconds": round(time.perf_counter() - started, 2)}


def resolve_shadow(spark, cfg, requests: DataFrame, pubs: list[dict], start: datetime, end: datetime,
                   dim: int) -> int | None:
    """In a rollout, what the new code space would have served each candidate whose publication
    resolved one in shadow (``shadow_code_version``), written to ``shadow_request_features``: the
    rows the consumers of the new FM or autoencoder learn from. Returns the rows written (None:
    no shadow here and no shadow table to keep in step)."""
    name = qualified_name(SHADOW_REQUEST_FEATURES, cfg.lake.database)
    shadowed = [i for i, p in enumerate(pubs) if p.get("shadow_code_version")]
    if not shadowed:
        if not spark.catalog.tableExists(name):
            return None
        if not in_time_range(spark.table(name), start, end).limit(1).count():
            return 0  # no rollout here and no earlier rows to clear: no write (an empty commit every hour)
    ensure_tables(spark, cfg, (SHADOW_REQUEST_FEATURES,))
    # the requests whose newest publication had a shadow: [its interval end, the next one's)
    ts = F.col("ts")
    during = F.lit(False)
    for i in shadowed:
        until = pubs[i + 1]["interval_end"] if i + 1 < len(pubs) else end
        during = during | ((ts >= F.lit(pubs[i]["interval_end"])) & (ts < F.lit(until)))
    as_shadow = [{**{k: v for k, v in p.items() if k != "shadow_code_version"}, "code_version": p.get("shadow_code_version")}
                 for p in pubs]
    rows = conform(resolve(requests.where(during), as_shadow, str(cfg.lake.tables_path), dim)
                   .withColumn("date", F.to_date("ts")), SHADOW_REQUEST_FEATURES).persist()
    try:
        n = rows.count()
        lake.replace(cfg, SHADOW_REQUEST_FEATURES, rows, f"ts >= '{start}' AND ts < '{end}'")  # a rerun: the same rows
    finally:
        rows.unpersist()
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.resolve_features", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", required=True, help="first request time (UTC, ISO), inclusive")
    p.add_argument("--end", required=True, help="last request time (UTC, ISO), exclusive")
    p.add_argument("--record-misses", action="store_true", help="queue non-exact candidates in miss_queue")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.config import load_config
    from include.spark import get_spark
    from include.cli import parse_time, print_counters

    cfg = load_config(a.config)
    print_counters("request features", run(get_spark(cfg), cfg, parse_time(a.start), parse_time(a.end),
                                           a.record_misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
