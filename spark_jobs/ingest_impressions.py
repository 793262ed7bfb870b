"""Ingest an impression log (CSV or Parquet): one row per item shown in a request, with its label.

    python -m spark_jobs.ingest_impressions --input PATH [--format csv|parquet] [--source NAME]
        [--map request_id=..,user_id=..,item_id=..,ts=..,label=..] [--ts-unit ms|s|iso]
        [--items PATH] [--truth PATH]
    spark-submit spark_jobs/ingest_impressions.py ...   (same arguments)

Columns: ``request_id, user_id, item_id, ts, label`` (1 clicked, 0 shown and not clicked, empty
unknown), optionally ``position`` (0-based slot), ``conversion`` (1 converted after the click) and
the context columns ``surface, device, region, referrer``. This is the synthetic impression
world's format (``python -m include.synthetic``) and the shape of most ranking logs: unlike a
click log, the negatives are what was really shown, so no candidates are generated.

``--items``: an item file (item_id, category, subcategory, title) into ``items``. ``--truth``: the
known click probabilities of a simulated log (request_id, item_id, p_click, p_conversion) into
``truth``, which only the evaluation reads.

Every record is accounted for: it becomes a request row, or lands in request_log_quarantine with
its reason (malformed line, missing id, bad label, position or conversion, unparsable or
out-of-range timestamp, a request whose rows disagree on the user or time, a repeated
(request, item)). Clicked rows become ``click`` events in user_events.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from feature_store import lake
from spark_jobs.ingest_clicklog import (CONTEXT, InputError, check_columns, check_spec, id_problem, parse_map,
                                        parse_timestamp, require_path, timestamp_problem)
from spark_jobs.raw_input import RAW, count_records, malformed, read_raw

REQUIRED = ("request_id", "user_id", "item_id", "ts", "label")
OPTIONAL = ("position", "conversion", *CONTEXT)


@dataclass(frozen=True)
class ImpressionLogSpec:
    source: str = "impressions"
    mapping: dict[str, str] = field(default_factory=lambda: {c: c for c in REQUIRED + OPTIONAL})
    ts_unit: str = "ms"  # ms | s | iso
    encoding: str = "utf-8"  # of CSV input

    def __post_init__(self):
        check_spec(self.mapping, self.ts_unit, REQUIRED, OPTIONAL)


def binary(text):
    """A 0/1 label column from its text: ``0``, ``1`` and their float forms (``1.0``, ``0.00``, as a
    float column reads) are 0 and 1; empty is NULL (unknown); anything else (``2``, ``true``,
    ``NaN``, ``inf``) is -1, which the reasons below quarantine with its raw value. Never a silent NULL."""
    number = F.nullif(text, F.lit("")).try_cast("double")
    return (F.when(text.isNull() | (text == ""), F.lit(None).cast("int"))
            .when(number == 0.0, F.lit(0)).when(number == 1.0, F.lit(1)).otherwise(F.lit(-1)))


def parse_impressions(raw: DataFrame, spec: ImpressionLogSpec, quality) -> DataFrame:
    """Raw string columns -> request_id, user_id, item_id, ts, position, label, conversion,
    context, raw, reason (null when the row is good); pure, the first reason that applies wins."""
    m = spec.mapping
    src = lambda c: F.trim(F.col(f"`{m[c]}`")) if c in m else F.lit(None).cast("string")  # noqa: E731
    blank = lambda c: src(c).isNull() | (src(c) == "")  # noqa: E731
    ts = parse_timestamp(src("ts"), spec.ts_unit)
    ts_problem = timestamp_problem(src("ts"), ts, spec.ts_unit, quality)
    label, conversion = (binary(src(c)) for c in ("label", "conversion"))
    position = F.nullif(src("position"), F.lit("")).try_cast("int")
    reason = (malformed(raw, "malformed record: wrong number of fields")
              .when(blank("request_id"), F.lit("missing request_id"))
              .when(blank("user_id"), F.lit("missing user_id"))
              .when(blank("item_id"), F.lit("missing item_id"))
              .when(id_problem(src("user_id"), "user_id").isNotNull(), id_problem(src("user_id"), "user_id"))
              .when(id_problem(src("item_id"), "item_id").isNotNull(), id_problem(src("item_id"), "item_id"))
              .when(blank("ts"), F.lit("missing timestamp"))
              .when(ts_problem.isNotNull(), ts_problem)
              .when(~blank("label") & ~label.isin(0, 1), F.concat(F.lit("label not 0, 1 or empty: "), src("label")))
              .when(~blank("conversion") & ~conversion.isin(0, 1),
                    F.concat(F.lit("conversion not 0, 1 or empty: "), src("conversion")))
              .when((conversion == 1) & ~(label == 1), F.lit("conversion without a click"))
              .when(~blank("position") & (position.isNull() | (position < 0)),
                    F.concat(F.lit("position not a non-negative integer: "), src("position"))))
    return raw.select(src("request_id").alias("request_id"), src("user_id").alias("user_id"),
                      src("item_id").alias("item_id"), ts.alias("ts"), position.alias("position"),
                      label.alias("label"), conversion.alias("conversion"), *[src(c).alias(c) for c in CONTEXT],
                      F.col(RAW).alias("raw"), reason.alias("reason"))


def mark_inconsistent(parsed: DataFrame, max_candidates: int) -> DataFrame:
    """Among good rows: a request whose rows name more than one user or time is not one request
    (all its rows are quarantined), a request of more than ``max_candidates`` rows is quarantined
    whole (``[quality] max_candidates_per_request``: one such request once failed the whole file's
    quality check), and a second row of the same (request, item) is a repeat."""
    good = F.col("reason").isNull()
    req = Window.partitionBy("request_id", good)
    # of a repeated (request, item), the row kept is the one with the click (and the conversion):
    # a click logged twice, once before its label arrived, is a click
    first = Window.partitionBy("request_id", "item_id", good).orderBy(
        F.desc_nulls_last("label"), F.desc_nulls_last("conversion"), "raw")
    disagree = (F.size(F.collect_set("user_id").over(req)) > 1) | (F.size(F.collect_set("ts").over(req)) > 1)
    items = F.size(F.collect_set("item_id").over(req))
    return (parsed
            .withColumn("reason", F.when(good & disagree, F.lit("request rows disagree on the user or the time"))
                        .when(good & (items > max_candidates),
                              F.concat(F.lit(f"request of more than {max_candidates} candidates "
                                             f"([quality] max_candidates_per_request): "), items.cast("string")))
                        .otherwise(F.col("reason")))
            .withColumn("_n", F.when(F.col("reason").isNull(), F.row_number().over(first)))
            .withColumn("reason", F.when(F.col("_n") > 1, F.lit("repeated item in request")).otherwise(F.col("reason")))
            .drop("_n"))


def to_requests(good: DataFrame, source: str) -> DataFrame:
    """Good rows -> request_log rows (request ids prefixed by the source, unique across logs)."""
    return good.select(F.concat(F.lit(f"{source}:"), "request_id").alias("request_id"), "user_id", "item_id", "ts",
                       "position", "label", "conversion", *CONTEXT, F.lit(source).alias("source"),
                       F.to_date("ts").alias("date"), F.hour("ts").alias("hour"))


def ingest(spark, cfg, path: str, spec: ImpressionLogSpec, fmt: str = "csv", items_path: str | None = None,
           truth_path: str | None = None):
    """Read, parse, quarantine and write; returns the IngestReport."""
    from spark_jobs.ingest_load import quarantine_rows, write_ingest

    started = time.perf_counter()
    raw_input = read_raw(spark, path, fmt, spec.encoding)
    raw = raw_input.records
    spec = check_columns(raw, spec, path, REQUIRED)
    parsed = mark_inconsistent(parse_impressions(raw, spec, cfg.quality),
                               cfg.quality.max_candidates_per_request).persist()
    try:
        records_in = count_records(spark, parsed, raw_input, path, fmt)
        ingested_at = lake.utc_now()  # bookkeeping, not data selection
        quarantine = quarantine_rows(parsed.where(F.col("reason").isNotNull()).select("raw", "reason").unionByName(raw_input.lines),
                                     spec.source, path, ingested_at)
        good = parsed.where(F.col("reason").isNull()).drop("raw", "reason")
        requests = to_requests(good, spec.source)
        clicks = good.where(F.col("label") == 1)
        events = clicks.select("user_id", "item_id", "ts", F.lit("click").alias("event_type"),
                               F.lit(spec.source).alias("source"), F.to_date("ts").alias("date")).distinct()
        items, other_inputs = None, []
        if items_path:
            from spark_jobs.ingest_items import read_items

            parsed_items = read_items(spark, items_path, spec.source)
            items = parsed_items.where(F.col("reason").isNull()).drop("raw", "reason")
            quarantine = quarantine.unionByName(
                quarantine_rows(parsed_items.where(F.col("reason").isNotNull()), spec.source, items_path, ingested_at))
            other_inputs.append(items_path)
        truth = read_truth(spark, truth_path, spec.source) if truth_path else None
        return write_ingest(spark, cfg, source=spec.source, input_path=path, records_in=records_in,
                            requests=requests, events=events, items=items, quarantine=quarantine, started=started,
                            other_inputs=tuple(other_inputs), pool_clicks=clicks.select("user_id", "item_id", "ts"), truth=truth)
    finally:
        parsed.unpersist()
        raw_input.release()


def read_truth(spark, path: str, source: str) -> DataFrame:
    """The truth file (request_id, item_id, p_click, p_conversion) with request ids as ingested."""
    require_path(spark, path)
    df = spark.read.option("header", True).csv(path)
    missing = [c for c in ("request_id", "item_id", "p_click") if c not in df.columns]
    if missing:
        raise InputError(f"{path}: truth file lacks column(s) {missing}; it has {df.columns}")
    p_conv = F.col("p_conversion").cast("double") if "p_conversion" in df.columns else F.lit(None).cast("double")
    return df.select(F.concat(F.lit(f"{source}:"), F.trim("request_id")).alias("request_id"),
                     F.trim("item_id").alias("item_id"), F.col("p_click").cast("double").alias("p_click"),
                     p_conv.alias("p_conversion"), F.lit(source).alias("source"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.ingest_impressions", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="file, folder or glob of CSV (optionally .gz) or Parquet")
    p.add_argument("--format", default="csv", choices=["csv", "parquet"])
    p.add_argument("--source", default="impressions", help="name recorded in the tables' source column")
    p.add_argument("--map", help="comma list of solaris_col=input_col (default: the same names)")
    p.add_argument("--ts-unit", choices=["ms", "s", "iso"], default="ms", help="timestamp unit (default ms)")
    p.add_argument("--items", help="item attribute file: item_id, category, subcategory, title")
    p.add_argument("--truth", help="known click probabilities of a simulated log, for the evaluation only")
    p.add_argument("--encoding", default="utf-8", help="character encoding of CSV input (default utf-8)")
    p.add_argument("--config", help="SOLARIS TOML config")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> ImpressionLogSpec:
    mapping = parse_map(args.map, {c: c for c in REQUIRED + OPTIONAL})
    return replace(ImpressionLogSpec(), source=args.source, mapping=mapping, ts_unit=args.ts_unit, encoding=args.encoding)


def main(argv: list[str] | None = None) -> int:
    from include.config import load_config
    from include.spark import get_spark

    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(args.config)
    try:
        spec = spec_from_args(args)
        report = ingest(get_spark(cfg), cfg, args.input, spec, args.format, args.items, args.truth)
    except InputError as e:  # one clear line, nothing written
        print(f"python -m spark_jobs.ingest_impressions: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines(cfg.lake.database)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
