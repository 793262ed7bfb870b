"""Ingest a click-only log (CSV or Parquet) into request_log, user_events and the quarantine.

The log needs a user id, an item id and a timestamp per click; context columns are optional.
A column mapping (``--map user_id=click_user,...`` or a preset such as ``--preset globo``) names
them. Clicks become requests with candidate lists by spark_jobs/candidates.py.

    python -m spark_jobs.ingest_clicklog --input PATH [--format csv|parquet] [--source NAME]
        [--preset globo] [--map user_id=...,item_id=...,ts=...,category=...] [--ts-unit ms|s|iso]
        [--items PATH]
    spark-submit spark_jobs/ingest_clicklog.py ...   (same arguments)

Every input record is accounted for: it becomes a request, or lands in
request_log_quarantine with its reason (malformed line, missing id, unparsable or out-of-range
timestamp, duplicate click).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake

from spark_jobs.candidates import clicks_to_requests
from spark_jobs.raw_input import (CORRUPT, RAW, UNDECODABLE, InputError, count_records,  # noqa: F401 (re-exported)
                                  data_columns, malformed, read_error, read_raw, require_path)

REQUIRED = ("user_id", "item_id", "ts")
CONTEXT = ("surface", "device", "region", "referrer")
ATTRIBUTES = ("category", "subcategory", "title")  # item attributes a click row may carry (-> items)

PRESETS: dict[str, dict] = {
    # Globo.com news portal click log (clicks_hour_NNN.csv.gz), millisecond timestamps.
    "globo": {
        "source": "globo",
        "ts_unit": "ms",
        "mapping": {"user_id": "user_id", "item_id": "click_article_id", "ts": "click_timestamp",
                    "surface": "click_environment", "device": "click_deviceGroup",
                    "region": "click_region", "referrer": "click_referrer_type"},
    },
    # The generic format, as the synthetic generator writes it.
    "generic": {
        "source": "clicklog",
        "ts_unit": "ms",
        "mapping": {"user_id": "user_id", "item_id": "item_id", "ts": "ts", "surface": "surface",
                    "device": "device", "region": "region", "referrer": "referrer"},
    },
}


@dataclass(frozen=True)
class ClickLogSpec:
    source: str
    mapping: dict[str, str] = field(default_factory=dict)  # SOLARIS column -> input column
    ts_unit: str = "ms"  # ms | s | iso
    encoding: str = "utf-8"  # of CSV input

    def __post_init__(self):
        check_spec(self.mapping, self.ts_unit, REQUIRED, CONTEXT + ATTRIBUTES)


def check_spec(mapping: dict[str, str], ts_unit: str, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    """A log adapter's column mapping and time unit, or ``InputError`` saying what to give instead."""
    if ts_unit not in ("ms", "s", "iso"):
        raise InputError(f"ts_unit must be ms, s or iso, got {ts_unit!r}")
    missing = [c for c in required if c not in mapping]
    if missing:
        raise InputError(f"column mapping lacks {missing}; give e.g. --map {','.join(f'{c}=COL' for c in missing)}")
    unknown = [c for c in mapping if c not in required + optional]
    if unknown:
        raise InputError(f"unknown mapped column(s) {unknown}; map only {required + optional}")


def parse_map(text: str | None, mapping: dict[str, str]) -> dict[str, str]:
    """``mapping`` overridden by a ``--map solaris_col=input_col,...`` value."""
    mapping = dict(mapping)
    for pair in (text.split(",") if text else []):
        if "=" not in pair:
            raise InputError(f"--map entries look like solaris_col=input_col, got {pair!r}")
        k, v = pair.split("=", 1)
        mapping[k.strip()] = v.strip()
    return mapping


# Epoch values past 9999-12-31 are no time at all; converting them overflows (and would stop the job).
MAX_EPOCH = {"ms": 253_402_300_799_999, "s": 253_402_300_799}
MAX_ID_LENGTH = 256  # as the lookup's ids (feature_store/ids.py)


def parse_timestamp(col, unit: str):
    """The time of ``col`` in ``unit``; NULL when it is not one (unparsable or out of range)."""
    if unit in MAX_EPOCH:
        v = col.try_cast("bigint")
        v = F.when(F.abs(v) <= F.lit(MAX_EPOCH[unit]), v)
        return F.timestamp_millis(v) if unit == "ms" else F.timestamp_seconds(v)
    return F.try_to_timestamp(col)


# 1e11: 1973-03-03 in milliseconds, the year 5138 in seconds. A millisecond value below it is almost
# surely a log in seconds read with the wrong unit (it would land in early 1970), not a log that old.
SECONDS_AS_MS_BELOW = 100_000_000_000


def timestamp_problem(text, ts, unit: str, quality):
    """Why a record's timestamp is not accepted, or NULL: unparsable, seconds read as milliseconds,
    or outside [min_ts, max_ts) (the reason names the bound it broke). ``text``: the raw value."""
    lo, hi = F.lit(quality.min_ts).cast("timestamp"), F.lit(quality.max_ts).cast("timestamp")
    problem = F.when(ts.isNull(), F.concat(F.lit(f"unparsable timestamp ({unit}): "), text))
    if unit == "ms":
        problem = problem.when(F.abs(text.try_cast("bigint")) < SECONDS_AS_MS_BELOW, F.concat(
            F.lit("timestamp looks like seconds read as milliseconds (before 1973-03-03; give --ts-unit s): "), text))
    return (problem.when(ts < lo, F.concat(F.lit(f"timestamp before min_ts {quality.min_ts}: "), ts.cast("string")))
            .when(ts >= hi, F.concat(F.lit(f"timestamp at or after max_ts {quality.max_ts}: "), ts.cast("string"))))


def id_problem(col, name: str):
    """Why ``col`` cannot be an id (over MAX_ID_LENGTH characters, a control character), or NULL."""
    return (F.when(F.length(col) > MAX_ID_LENGTH,
                   F.concat(F.lit(f"{name} over {MAX_ID_LENGTH} characters: "), F.length(col).cast("string")))
            .when(col.rlike("[\\x00-\\x1f\\x7f]"), F.concat(F.lit(f"{name} holds a control character: "), F.to_json(F.array(col)))))


def parse_clicks(raw: DataFrame, spec: ClickLogSpec, quality) -> DataFrame:
    """Raw string columns -> user_id, item_id, ts, context, raw, reason (null when the row is good).

    Pure: reasons are assigned in a fixed order, the first that applies wins.
    """
    m = spec.mapping
    src = lambda c: F.trim(F.col(f"`{m[c]}`")) if c in m else F.lit(None).cast("string")  # noqa: E731
    ts = parse_timestamp(src("ts"), spec.ts_unit)
    ts_problem = timestamp_problem(src("ts"), ts, spec.ts_unit, quality)
    blank = lambda c: src(c).isNull() | (src(c) == "")  # noqa: E731
    reason = (malformed(raw, "malformed record: wrong number of fields")
              .when(blank("user_id"), F.lit("missing user_id"))
              .when(blank("item_id"), F.lit("missing item_id"))
              .when(id_problem(src("user_id"), "user_id").isNotNull(), id_problem(src("user_id"), "user_id"))
              .when(id_problem(src("item_id"), "item_id").isNotNull(), id_problem(src("item_id"), "item_id"))
              .when(blank("ts"), F.lit("missing timestamp"))
              .when(ts_problem.isNotNull(), ts_problem))
    return raw.select(src("user_id").alias("user_id"), src("item_id").alias("item_id"), ts.alias("ts"),
                      *[src(c).alias(c) for c in CONTEXT + ATTRIBUTES], F.col(RAW).alias("raw"), reason.alias("reason"))


def mark_duplicates(parsed: DataFrame) -> DataFrame:
    """A second click with the same (user, item, ts) is a duplicate record, not a second request."""
    from pyspark.sql import Window

    # Only good rows compete: a malformed line that parses to the same key must not outrank one.
    w = Window.partitionBy("user_id", "item_id", "ts", F.col("reason").isNull()).orderBy("raw")
    ranked = parsed.withColumn("_n", F.when(F.col("reason").isNull(), F.row_number().over(w)))
    return ranked.withColumn("reason", F.when(F.col("_n") > 1, F.lit("duplicate click (same user, item, ts)"))
                             .otherwise(F.col("reason"))).drop("_n")


def check_columns(raw: DataFrame, spec, path: str, required: tuple[str, ...] = REQUIRED):
    """Required columns must be present; optional columns that are absent become NULL. ``spec``:
    any dataclass with a ``mapping`` (SOLARIS column -> input column)."""
    have = data_columns(raw)
    missing = [f"{k} (from column {v!r})" for k, v in spec.mapping.items() if k in required and v not in have]
    if missing:
        raise InputError(f"{path}: input lacks mapped column(s) {missing}; it has {have}")
    absent = [k for k, v in spec.mapping.items() if v not in have]
    if absent:
        print(f"note: {path} has no column for {absent}; they are stored as NULL", file=sys.stderr)
    return replace(spec, mapping={k: v for k, v in spec.mapping.items() if v in have})


def click_items(clicks: DataFrame, spec: ClickLogSpec) -> DataFrame | None:
    """Item attributes carried by the click rows (mapped ``ATTRIBUTES``), the earliest click's per item."""
    from pyspark.sql import Window

    if not any(a in spec.mapping for a in ATTRIBUTES):
        return None
    first = Window.partitionBy("item_id").orderBy("ts", "user_id")
    return (clicks.withColumn("_n", F.row_number().over(first)).where("_n = 1")
            .select("item_id", *[F.nullif(F.col(a), F.lit("")).alias(a) for a in ATTRIBUTES],
                    F.lit(spec.source).alias("source")))


def ingest(spark, cfg, path: str, spec: ClickLogSpec, fmt: str = "csv", items_path: str | None = None):
    """Read, parse, generate candidates and write; returns the IngestReport. ``items_path``: an
    item attribute file (spark_jobs/ingest_items.py), which wins over attributes on the clicks."""
    from spark_jobs.ingest_load import quarantine_rows, write_ingest

    started = time.perf_counter()
    raw_input = read_raw(spark, path, fmt, spec.encoding)
    raw = raw_input.records
    spec = check_columns(raw, spec, path)
    # Spark refuses queries over only _corrupt_record of an uncached CSV scan; cache once, read twice.
    parsed = mark_duplicates(parse_clicks(raw, spec, cfg.quality)).persist()
    try:
        records_in = count_records(spark, parsed, raw_input, path, fmt)
        ingested_at = lake.utc_now()  # bookkeeping, not data selection
        bad = quarantine_rows(parsed.where(F.col("reason").isNotNull()).select("raw", "reason").unionByName(raw_input.lines),
                              spec.source, path, ingested_at)
        clicks = parsed.where(F.col("reason").isNull()).drop("raw", "reason")
        items, other_inputs = click_items(clicks, spec), ()
        if items_path:
            from spark_jobs.ingest_items import read_items

            parsed_items = read_items(spark, items_path, spec.source)
            from_file = parsed_items.where(F.col("reason").isNull()).drop("raw", "reason")
            items = from_file if items is None else from_file.unionByName(
                items.join(from_file.select("item_id"), "item_id", "left_anti"))
            bad = bad.unionByName(quarantine_rows(parsed_items.where(F.col("reason").isNotNull()), spec.source,
                                                  items_path, ingested_at))
            other_inputs = (items_path,)
        clicks = clicks.drop(*ATTRIBUTES)
        params = cfg.clicklog
        prior = _other_inputs_clicks(spark, cfg, spec.source, path, clicks, params)
        requests = clicks_to_requests(clicks, params, spec.source, prior)
        pool_clicks = clicks.select("user_id", "item_id", "ts")
        if prior is not None:
            pool_clicks = pool_clicks.unionByName(prior.select("user_id", "item_id", "ts"))
        events = clicks.select("user_id", "item_id", "ts", F.lit("click").alias("event_type"),
                               F.lit(spec.source).alias("source"), F.to_date("ts").alias("date"))
        return write_ingest(spark, cfg, source=spec.source, input_path=path, records_in=records_in,
                            requests=requests, events=events, items=items, quarantine=bad, started=started,
                            pool_clicks=pool_clicks, other_inputs=other_inputs, generated=True)
    finally:
        parsed.unpersist()
        raw_input.release()


def _other_inputs_clicks(spark, cfg, source: str, path: str, clicks: DataFrame, params) -> DataFrame | None:
    """Clicks of this source that other inputs brought, from a day before this input's first hour
    (the leak check's look-back) to the pools' window after its last (``max_window_hours``): a log
    split into files that overlap in time (Globo's session files) draws from the same clicks as the
    log ingested whole, for the hours both inputs hold."""
    from feature_store.tables import USER_EVENTS, qualified_name

    name = qualified_name(USER_EVENTS, cfg.lake.database)
    if not spark.catalog.tableExists(name):
        return None
    start, end = clicks.agg(F.min("ts"), F.max("ts")).first()
    if start is None:
        return None
    return (spark.table(name)
            .where((F.col("source") == source) & (F.col("event_type") == "click") & (F.col("input_path") != path)
                   & (F.col("ts") >= F.date_trunc("hour", F.lit(start)) - F.expr("INTERVAL 25 HOURS"))
                   & (F.col("ts") < F.lit(end) + F.expr(f"INTERVAL {params.max_window_hours + 1} HOURS")))
            .select("user_id", "item_id", "ts"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.ingest_clicklog", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="file, folder or glob of CSV (optionally .gz) or Parquet")
    p.add_argument("--format", default="csv", choices=["csv", "parquet"])
    p.add_argument("--preset", choices=sorted(PRESETS), default="generic")
    p.add_argument("--source", help="name recorded in the tables' source column (default: the preset's)")
    p.add_argument("--map", help="comma list of solaris_col=input_col overriding the preset")
    p.add_argument("--ts-unit", choices=["ms", "s", "iso"], help="timestamp unit (default: the preset's)")
    p.add_argument("--items", help="item attribute file: item_id, category, subcategory, title")
    p.add_argument("--encoding", default="utf-8", help="character encoding of CSV input (default utf-8)")
    p.add_argument("--config", help="SOLARIS TOML config")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace, cfg) -> ClickLogSpec:
    preset = PRESETS[args.preset]
    mapping = parse_map(args.map, preset["mapping"])
    return ClickLogSpec(source=args.source or preset["source"], mapping=mapping,
                        ts_unit=args.ts_unit or preset["ts_unit"], encoding=getattr(args, "encoding", "utf-8"))


def main(argv: list[str] | None = None) -> int:
    from include.config import load_config
    from include.spark import get_spark

    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(args.config)
    try:
        spec = spec_from_args(args, cfg)
        report = ingest(get_spark(cfg), cfg, args.input, spec, args.format, args.items)
    except InputError as e:  # one clear line, nothing written
        print(f"python -m spark_jobs.ingest_clicklog: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines(cfg.lake.database)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
