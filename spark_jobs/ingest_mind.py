"""Ingest MIND-format logs (behaviors.tsv + news.tsv) into request_log, user_events and items.

    python -m spark_jobs.ingest_mind --behaviors PATH [--news PATH] [--source mind]
    spark-submit spark_jobs/ingest_mind.py ...   (same arguments)

One impression line is one request: ``impression_id, user_id, time, history, impressions`` with
impressions as ``Nxxx-1`` (clicked) / ``Nxxx-0`` (shown, not clicked) / ``Nxxx`` (test split:
label unknown, stored as NULL). Times such as ``11/12/2019 2:14:46 PM`` are read as UTC.

History lists the user's clicks *before* the log window, without times. They become
``user_events`` rows of type ``history`` placed just before the first request of the input, one
second apart in listed order, so that point-in-time history reads them as older than every
request. Clicked candidates become ``click`` events at the request time.

A line that cannot be used whole (wrong field count, missing user, unparsable time, a malformed
candidate token, a repeated impression id) lands in request_log_quarantine with its reason.
"""

from __future__ import annotations

import argparse
import sys
import time

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from feature_store import lake
from spark_jobs.ingest_clicklog import id_problem

MIND_TIME = "M/d/yyyy h:mm:ss a"
TOKEN = r"^[^\s-]+(-[01])?$"


def parse_behaviors(lines: DataFrame, source: str) -> DataFrame:
    """Text lines (column ``value``) -> one row per line with parsed fields and a ``reason``."""
    # get() rather than f[i]: a short line yields NULL fields (then a reason), not a failed job.
    f = F.split("value", "\t", -1)
    tokens = F.filter(F.split(F.trim(F.get(f, 4)), r"\s+"), lambda t: t != "")
    ts = F.try_to_timestamp(F.trim(F.get(f, 2)), F.lit(MIND_TIME))
    parsed = lines.select(
        F.col("value").alias("raw"), F.trim(F.get(f, 0)).alias("impression_id"), F.trim(F.get(f, 1)).alias("user_id"),
        ts.alias("ts"), F.filter(F.split(F.trim(F.get(f, 3)), r"\s+"), lambda t: t != "").alias("history"),
        tokens.alias("tokens"), F.size(f).alias("n_fields"))
    items = F.transform("tokens", lambda t: F.split(t, "-")[0])
    reason = (F.when(F.col("n_fields") != 5, F.concat(F.lit("malformed line: expected 5 tab-separated fields, got "),
                                                       F.col("n_fields").cast("string")))
              .when(F.col("impression_id") == "", F.lit("missing impression_id"))
              .when(F.col("user_id") == "", F.lit("missing user_id"))
              .when(~F.is_valid_utf8("raw"), F.lit("undecodable bytes: not utf-8 text"))
              .when(id_problem(F.col("user_id"), "user_id").isNotNull(), id_problem(F.col("user_id"), "user_id"))
              .when(F.col("ts").isNull(), F.lit("unparsable time (expected M/d/yyyy h:mm:ss AM/PM)"))
              .when(F.size("tokens") == 0, F.lit("no candidates in impression"))
              .when(F.exists("tokens", lambda t: ~t.rlike(TOKEN)), F.lit("malformed candidate token (expected ITEM, ITEM-0 or ITEM-1)"))
              .when(F.size(F.array_distinct(items)) != F.size(items), F.lit("repeated candidate in impression")))
    parsed = parsed.withColumn("reason", reason)
    w = Window.partitionBy("impression_id", F.col("reason").isNull()).orderBy("raw")
    dup = F.when(F.col("reason").isNull(), F.row_number().over(w))
    return (parsed.withColumn("_n", dup)
            .withColumn("reason", F.when(F.col("_n") > 1, F.lit("repeated impression_id")).otherwise(F.col("reason")))
            .drop("_n").withColumn("request_id", F.concat(F.lit(f"{source}:"), "impression_id")))


def to_requests(good: DataFrame, source: str) -> DataFrame:
    """Parsed good lines -> request_log rows, one per candidate."""
    rows = good.select("request_id", "user_id", "ts", F.posexplode("tokens").alias("position", "token"))
    label = F.when(F.col("token").contains("-"), F.split("token", "-")[1].cast("int"))
    return rows.select(
        "request_id", "user_id", F.split("token", "-")[0].alias("item_id"), "ts", "position", label.alias("label"),
        F.lit("news").alias("surface"), F.lit(None).cast("string").alias("device"),
        F.lit(None).cast("string").alias("region"), F.lit(None).cast("string").alias("referrer"),
        F.lit(source).alias("source"), F.to_date("ts").alias("date"), F.hour("ts").alias("hour"))


def to_events(good: DataFrame, requests: DataFrame, source: str) -> DataFrame:
    """Clicked candidates at request time, plus pre-log history placed before the input's first request."""
    clicks = requests.where(F.col("label") == 1).select("user_id", "item_id", "ts", F.lit("click").alias("event_type"))
    start = good.agg(F.min("ts").alias("start"))
    # A user's history is the same list on each of their lines; take it from the earliest line.
    first = Window.partitionBy("user_id").orderBy("ts", "request_id")
    hist = (good.withColumn("_n", F.row_number().over(first)).where("_n = 1")
            .select("user_id", F.posexplode("history").alias("idx", "item_id"), F.size("history").alias("n"))
            .crossJoin(start)
            .select("user_id", "item_id",
                    F.timestamp_seconds(F.unix_seconds("start") - (F.col("n") - F.col("idx"))).alias("ts"),
                    F.lit("history").alias("event_type")))
    # A history list may name an item twice; keep its latest position as one event.
    hist = hist.groupBy("user_id", "item_id", "event_type").agg(F.max("ts").alias("ts"))
    events = clicks.unionByName(hist)
    return events.select("user_id", "item_id", "ts", "event_type", F.lit(source).alias("source"),
                         F.to_date("ts").alias("date"))


def parse_news(lines: DataFrame) -> DataFrame:
    f = F.split("value", "\t", -1)
    reason = (F.when(F.size(f) < 4, F.lit("malformed news line: expected at least 4 tab-separated fields"))
              .when(F.trim(F.get(f, 0)) == "", F.lit("missing news_id")))
    return lines.select(F.col("value").alias("raw"), F.trim(F.get(f, 0)).alias("item_id"), F.trim(F.get(f, 1)).alias("category"),
                        F.trim(F.get(f, 2)).alias("subcategory"), F.get(f, 3).alias("title"), reason.alias("reason"))


def ingest(spark, cfg, behaviors: str, news: str | None = None, source: str = "mind"):
    from spark_jobs.raw_input import InputError, read_error, require_path
    from spark_jobs.ingest_load import quarantine_rows, write_ingest

    started = time.perf_counter()
    require_path(spark, behaviors)
    lines = spark.read.text(behaviors)
    blanks = lines.where(F.trim("value") == "").select(F.col("value").alias("raw"), F.lit("blank line").alias("reason"))
    parsed = parse_behaviors(lines.where(F.trim("value") != ""), source).persist()
    try:
        try:
            records_in, n_blank = parsed.count(), blanks.count()
        except Exception as e:  # a truncated gzip, an unreadable file
            raise read_error(behaviors, "text", e) from e
        if records_in == 0:
            raise InputError(f"{behaviors}: no impression lines")
        records_in += n_blank  # blank lines are records too: quarantined, counted
        ingested_at = lake.utc_now()  # bookkeeping, not data selection
        quarantine = quarantine_rows(parsed.where(F.col("reason").isNotNull()).select("raw", "reason").unionByName(blanks),
                                     source, behaviors, ingested_at)
        good = parsed.where(F.col("reason").isNull())
        requests = to_requests(good, source)
        events = to_events(good, requests, source)
        items = None
        if news:
            require_path(spark, news)
            news_rows = parse_news(spark.read.text(news).where(F.trim("value") != ""))
            quarantine = quarantine.unionByName(
                quarantine_rows(news_rows.where(F.col("reason").isNotNull()), source, news, ingested_at))
            items = news_rows.where(F.col("reason").isNull()).drop("raw", "reason").withColumn("source", F.lit(source))
        return write_ingest(spark, cfg, source=source, input_path=behaviors, records_in=records_in,
                            requests=requests, events=events, items=items, quarantine=quarantine, started=started,
                            other_inputs=(news,) if news else ())
    finally:
        parsed.unpersist()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.ingest_mind", description=__doc__.split("\n\n")[0])
    p.add_argument("--behaviors", required=True, help="behaviors.tsv (file, folder or glob)")
    p.add_argument("--news", help="news.tsv with item attributes")
    p.add_argument("--source", default="mind")
    p.add_argument("--config", help="SOLARIS TOML config")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from include.config import load_config
    from include.spark import get_spark

    from spark_jobs.raw_input import InputError

    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(args.config)
    try:
        report = ingest(get_spark(cfg), cfg, args.behaviors, args.news, args.source)
    except InputError as e:  # one clear line, nothing written
        print(f"python -m spark_jobs.ingest_mind: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines(cfg.lake.database)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
