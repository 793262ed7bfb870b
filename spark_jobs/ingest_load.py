"""Write one ingest run's outputs: validated requests, history events, items, quarantine, counters.

Shared by every ingest job so that all sources land the same way:

- the request rows are validated with great-expectations *before* anything is written, so a
  failed validation leaves the tables as they were;
- every write is idempotent per input: ``replaceWhere`` on (source, input_path) for
  ``request_log``, ``user_events`` and the quarantine, MERGE on the key for ``items`` and
  ``ingest_runs``. Ingesting the same input twice leaves the same tables, and ingesting another
  input never removes a row that came from a different one, whatever their time ranges;
- a request that another input already brought (the same request id: the same click, the same
  impression) is quarantined as such rather than written twice, and an event already present
  from another input is kept once and counted (``events_already_present``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake, quality
from feature_store.tables import (INGEST_RUNS, ITEMS, REQUEST_LOG, REQUEST_LOG_QUARANTINE, TRUTH, USER_EVENTS,
                                  conform, ensure_tables, qualified_name)
from include.config import LEAK_STATISTICS
from spark_jobs.raw_input import InputError


# What to try when a whole input lands in the quarantine for one reason.
QUARANTINE_HINTS = (
    ("timestamp", "the timestamps may be in another unit or format: try --ts-unit s, ms or iso"),
    ("missing user_id", "the user id column may be named otherwise: --map user_id=COLUMN"),
    ("missing item_id", "the item id column may be named otherwise: --map item_id=COLUMN"),
    ("missing request_id", "the request id column may be named otherwise: --map request_id=COLUMN"),
    ("wrong number of fields", "the file may not be comma-separated CSV with a header (--format parquet?)"),
    ("already ingested", "this input's requests came with another input already: nothing new to ingest"),
)


@dataclass(frozen=True)
class IngestReport:
    run_id: str
    source: str
    input_path: str
    records_in: int
    request_rows: int
    requests: int
    event_rows: int
    item_rows: int
    quarantined: int
    min_ts: datetime | None
    max_ts: datetime | None
    seconds: float
    finished_at: datetime
    quality_report: str | None = None
    popularity_auc: float | None = None  # single-feature AUCs of generated candidates (click logs only)
    recent_click_auc: float | None = None
    known_item_auc: float | None = None
    position_auc: float | None = None
    same_category_auc: float | None = None  # the user's side (None where no candidate has a known category)
    category_share_auc: float | None = None
    interacted_before_auc: float | None = None
    leaks: tuple[str, ...] = ()  # generated candidates: statistics outside [quality]'s band, as "prior popularity AUC 0.017"
    candidates: str | None = None  # "generated" (a click log: SOLARIS drew the negatives) or "logged" (as shown)
    events_already_present: int = 0  # events another input had already brought (kept once)
    reasons: tuple[tuple[str, int], ...] = ()  # quarantine counts by reason category

    def lines(self, database: str) -> list[str]:
        return [*self._lines(database), *self.quarantine_lines(), *self.leak_lines()]

    def quarantine_lines(self) -> list[str]:
        out = [f"    {n:>12,}  {reason}" for reason, n in self.reasons[:5]]
        if self.records_in and self.quarantined >= self.records_in and len(self.reasons) == 1:
            hint = next((h for key, h in QUARANTINE_HINTS if key in self.reasons[0][0]), None)
            out.append(f"  every record was quarantined as {self.reasons[0][0]!r}"
                       + (f": {hint}" if hint else ": check the input against the adapter's expected columns"))
        return out

    def leak_lines(self) -> list[str]:
        if self.popularity_auc is None:
            return []
        stats = {label: getattr(self, key) for key, label in LEAK_STATISTICS}
        out = ["  leak check, single-feature AUC of the requests (0.5: no signal): "
               + ", ".join(f"{name} {v:.3f}" for name, v in stats.items() if v is not None)
               + ("" if self.candidates == "generated" else " (logged impressions: reported, not judged)")]
        out += [f"  WARNING: {finding} alone separates clicks from negatives: a model trained on these requests "
                f"learns the generator; training refuses this source unless --allow-leaking-candidates"
                for finding in self.leaks]
        return out

    def _lines(self, database: str) -> list[str]:
        return [
            f"ingested {self.source} from {self.input_path} in {self.seconds:.1f} s",
            f"  records read            {self.records_in:>12,}",
            f"  -> {database}.request_log        {self.request_rows:>12,} rows ({self.requests:,} requests, "
            f"{self.min_ts} .. {self.max_ts})",
            f"  -> {database}.user_events        {self.event_rows:>12,} rows"
            + (f" ({self.events_already_present:,} more already there from another input)" if self.events_already_present else ""),
            f"  -> {database}.items              {self.item_rows:>12,} rows",
            f"  -> {database}.request_log_quarantine {self.quarantined:>8,} records",
            f"  quality report: {self.quality_report}",
        ]


def quarantine_rows(raw: DataFrame, source: str, input_path: str, ingested_at: datetime) -> DataFrame:
    """``raw`` has columns raw, reason (``category`` or ``category: value``); add the run's identity
    and split the reason into its stable category and the offending value."""
    parts = F.split("reason", ": ", 2)
    return raw.select("raw", F.lit(source).alias("source"), F.lit(input_path).alias("input_path"),
                      parts[0].alias("reason"), F.lit(ingested_at).cast("timestamp").alias("ingested_at"),
                      F.get(parts, 1).alias("value"))


def write_ingest(spark, cfg, *, source: str, input_path: str, records_in: int, requests: DataFrame,
                 events: DataFrame, items: DataFrame | None, quarantine: DataFrame,
                 started: float, other_inputs: tuple[str, ...] = (), pool_clicks: DataFrame | None = None,
                 truth: DataFrame | None = None, generated: bool = False) -> IngestReport:
    """Validate, then write every output of one run. ``other_inputs`` are further files whose bad
    records are in ``quarantine`` (e.g. MIND's news.tsv beside behaviors.tsv). ``pool_clicks``: the
    clicks of the log (user_id, item_id, ts; for click logs, those the candidates were drawn from):
    the leak check runs on them. ``generated``: the candidates were drawn by SOLARIS (a click log), so a statistic
    outside the band is a leak that training refuses; logged impressions are reported, not judged.
    ``truth``: known click probabilities of a simulated log, written to ``truth``."""
    if (problem := source_problem(source)) is not None:
        raise InputError(problem)
    ensure_tables(spark, cfg)
    cached = []

    def cache(df):
        cached.append(df.persist())
        return df

    try:
        if "conversion" not in requests.columns:  # a log with one label
            requests = requests.withColumn("conversion", F.lit(None).cast("int"))
        requests = cache(conform(requests.withColumn("input_path", F.lit(input_path)), REQUEST_LOG))
        events = cache(conform(events.withColumn("input_path", F.lit(input_path)), USER_EVENTS))
        requests, events, repeated, events_present = _without_other_inputs(spark, cfg, source, input_path, requests, events)
        quarantine = quarantine.unionByName(quarantine_rows(repeated, source, input_path, lake.utc_now()))
        # Materialized, not cached: these rows were read against request_log and user_events, and a
        # write to a table empties every cache whose plan reads it (Spark re-caches on next use), so
        # after the first write below each action (the leak check, the counts) computed them again,
        # candidates and all: about 210 Spark jobs per small ingest instead of 130
        # (benchmarks/bench_small_ingest.py).
        requests, events = requests.localCheckpoint(), events.localCheckpoint()
        quarantine = conform(quarantine, REQUEST_LOG_QUARANTINE).localCheckpoint()
        stats = requests.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("request_id").alias("requests"),
                             F.min("ts").alias("min_ts"), F.max("ts").alias("max_ts")).first()
        ev = events.agg(F.count(F.lit(1)).alias("rows"), F.min("ts").alias("min_ts"), F.max("ts").alias("max_ts")).first()
        run_id = f"{source}|{input_path}|{stats.min_ts}|{stats.max_ts}"

        # Validate before writing: a failed expectation raises and nothing lands.
        report_path = None
        if stats.rows:
            report_path = quality.validate_request_log(requests, cfg, run_name=_safe(run_id))

        paths = ", ".join(f"'{_sql(p)}'" for p in (input_path, *other_inputs))
        mine = f"source = '{_sql(source)}' AND input_path = '{_sql(input_path)}'"
        lake.replace(cfg, REQUEST_LOG_QUARANTINE, quarantine,
                     f"source = '{_sql(source)}' AND input_path IN ({paths})")
        # Always written, even when empty: a rerun of an input that now yields nothing removes its rows.
        lake.replace(cfg, REQUEST_LOG, requests, mine, repartition=True)
        lake.replace(cfg, USER_EVENTS, events, mine, repartition=True)
        item_rows = 0
        if items is not None:
            items = conform(items, ITEMS)
            items = items.dropDuplicates(list(ITEMS.primary_key))
            lake.upsert(spark, cfg, ITEMS, items)
            item_rows = items.count()
        if truth is not None:
            lake.replace(cfg, TRUTH, conform(truth.withColumn("input_path", F.lit(input_path)), TRUTH), mine)
        leak = {}
        if pool_clicks is not None and stats.rows:
            from spark_jobs.candidates import leak_statistics, user_leak_statistics

            # the lake's item attributes (this input's among them, just merged): the user-side
            # category statistics read every item's category that any input brought
            categories = spark.table(qualified_name(ITEMS, cfg.lake.database)).select("item_id", "category")
            leak = leak_statistics(requests, pool_clicks) | user_leak_statistics(requests, pool_clicks, categories)
            leak["leaks"] = tuple(cfg.quality.leaks(leak)) if generated else ()
        reasons = (quarantine.groupBy(F.col("reason").alias("r")).count()
                   .orderBy(F.desc("count"), "r").collect())
        report = IngestReport(
            **leak, candidates="generated" if generated else "logged", reasons=tuple((r.r, r["count"]) for r in reasons), events_already_present=events_present, run_id=run_id, source=source, input_path=input_path, records_in=records_in,
            request_rows=stats.rows, requests=stats.requests, event_rows=ev.rows, item_rows=item_rows,
            quarantined=sum(r["count"] for r in reasons), min_ts=stats.min_ts, max_ts=stats.max_ts,
            seconds=round(time.perf_counter() - started, 3),
            finished_at=lake.utc_now(),  # bookkeeping only, not data selection
            quality_report=report_path)
        run_row = {k: v for k, v in asdict(report).items() if k in INGEST_RUNS.column_names}
        lake.upsert(spark, cfg, INGEST_RUNS, conform(spark.createDataFrame([run_row], INGEST_RUNS.schema()), INGEST_RUNS))
        return report
    finally:
        for df in cached:
            df.unpersist()


ALREADY_INGESTED = "request already ingested from another input"
REUSED_ID = "request_id already used by another request of this source"


def source_problem(source: str) -> str | None:
    """Why ``source`` cannot name a log, or None. Request ids are stored as "<source>:<id>", so a
    ':' in a source would let "a:b" + "c" and "a" + "b:c" name one request."""
    if not source or ":" in source or source != source.strip() or any(ord(c) < 32 for c in source):
        return (f"source name {source!r} is not usable: it must be non-empty, without ':' (request ids are "
                f"stored as '<source>:<id>'), spaces at its ends or control characters")
    return None


def _without_other_inputs(spark, cfg, source: str, input_path: str, requests: DataFrame, events: DataFrame):
    """Split off what other inputs of ``source`` already wrote: requests whose id is in
    ``request_log`` from another input (returned as quarantine rows, one per request: raw, reason)
    and events whose key is in ``user_events`` from another input (left out and counted: the row
    is there once). Only this input's time range of each table is read."""
    from feature_store.tables import in_time_range

    other = (F.col("source") == source) & (F.col("input_path").isNull() | (F.col("input_path") != input_path))

    def rows_of_others(spec, df, columns):
        lo, hi = df.agg(F.min("ts"), F.max("ts")).first()
        if lo is None:
            return None
        table = spark.table(qualified_name(spec, cfg.lake.database))
        return in_time_range(table, lo, hi + timedelta(microseconds=1)).where(other).select(*columns).distinct()

    # Request ids are looked up in every other input of the source, whatever its time: a request id
    # reused at another time (by another user) is refused as well as one ingested twice. Only the
    # request_id column is read.
    ids = requests.select("request_id").distinct()
    taken = (spark.table(qualified_name(REQUEST_LOG, cfg.lake.database)).where(other)
             .select("request_id").distinct().join(ids, "request_id", "left_semi"))
    repeated = requests.join(taken, "request_id", "left_semi")
    requests = requests.join(taken, "request_id", "left_anti")
    present = 0
    key = list(USER_EVENTS.primary_key)
    there = rows_of_others(USER_EVENTS, events, key)
    if there is not None:
        present = events.join(there, key, "left_semi").count()
        if present:
            events = events.join(there, key, "left_anti")
    held = (spark.table(qualified_name(REQUEST_LOG, cfg.lake.database)).where(other)
            .join(repeated.select("request_id").distinct(), "request_id", "left_semi")
            .groupBy("request_id").agg(F.first("user_id").alias("held_user"), F.min("ts").alias("held_ts"),
                                       F.first("input_path").alias("held_input")))
    bad = (repeated.groupBy("request_id", "user_id", "ts").agg(F.sort_array(F.collect_list("item_id")).alias("item_ids"))
           .join(held, "request_id", "left")
           .select(F.to_json(F.struct("request_id", "user_id", F.col("ts").cast("string").alias("ts"), "item_ids")).alias("raw"),
                   F.when((F.col("held_user") == F.col("user_id")) & (F.col("held_ts") == F.col("ts")), F.lit(ALREADY_INGESTED))
                   .otherwise(F.concat(F.lit(f"{REUSED_ID}: "), F.coalesce("held_input", F.lit("?")),
                                       F.lit(" has it for user "), F.col("held_user"), F.lit(" at "),
                                       F.col("held_ts").cast("string"))).alias("reason")))
    return requests, events, bad, present


def _sql(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "\\'")


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:180]
