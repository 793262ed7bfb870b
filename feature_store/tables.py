"""Every SOLARIS table, declared once.

Jobs, data-quality checks, the online lookup and the docs read these declarations; a table is
created from its declaration (``ensure_table``) as an external Delta table under the lake root,
so Spark finds it by name (``solaris.request_log``) and delta-rs finds it by path.

All timestamps are UTC. ``expiry`` says what a row's lifetime means for readers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: tuple[tuple[str, str, str], ...]  # (name, Spark SQL type, comment)
    primary_key: tuple[str, ...]
    partition_by: tuple[str, ...] = ()
    description: str = ""
    expiry: str = "rows never expire"

    @property
    def ddl(self) -> str:
        """Column list in Spark SQL DDL, e.g. ``user_id STRING NOT NULL, ts TIMESTAMP``."""
        return ", ".join(f"{n} {t}" for n, t, _ in self.columns)

    @property
    def column_names(self) -> list[str]:
        return [n for n, _, _ in self.columns]

    def schema(self):
        from pyspark.sql.types import StructType

        return StructType.fromDDL(self.ddl)


REQUEST_LOG = TableSpec(
    name="request_log",
    description="One row per candidate shown in a ranking request: what was served, and the click label.",
    columns=(
        ("request_id", "STRING", "unique per request across sources: '<source>:<id>'"),
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("ts", "TIMESTAMP", "request time, UTC"),
        ("position", "INT", "0-based slot of the candidate in the request"),
        ("label", "INT", "1 clicked, 0 shown and not clicked, NULL unknown"),
        ("surface", "STRING", "where the request came from (page, app environment)"),
        ("device", "STRING", "device group, when the log has it"),
        ("region", "STRING", "region, when the log has it"),
        ("referrer", "STRING", "referrer type, when the log has it"),
        ("source", "STRING", "which ingested log the row came from (mind, globo, synthetic, ...)"),
        ("date", "DATE", "partition: UTC date of ts"),
        ("hour", "INT", "partition: UTC hour of ts"),
    ),
    primary_key=("request_id", "item_id"),
    partition_by=("date", "hour"),
)

USER_EVENTS = TableSpec(
    name="user_events",
    description="Positive interactions (clicks, and MIND's pre-log history) that history features read.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("ts", "TIMESTAMP", "event time, UTC; MIND history events are placed before the log, in order"),
        ("event_type", "STRING", "'click' or 'history' (MIND's clicks before the log window)"),
        ("source", "STRING", "which ingested log the row came from"),
        ("date", "DATE", "partition: UTC date of ts"),
    ),
    primary_key=("user_id", "item_id", "ts", "event_type"),
    partition_by=("date",),
)

ITEMS = TableSpec(
    name="items",
    description="Item attributes where the source provides them; most logs cover only part of their items.",
    columns=(
        ("item_id", "STRING", "source item id"),
        ("category", "STRING", "top-level category"),
        ("subcategory", "STRING", "finer category"),
        ("title", "STRING", "title text"),
        ("source", "STRING", "which ingested log the row came from"),
    ),
    primary_key=("item_id",),
)

REQUEST_LOG_QUARANTINE = TableSpec(
    name="request_log_quarantine",
    description="Input records that could not be ingested, kept whole with the reason; nothing is dropped silently.",
    columns=(
        ("raw", "STRING", "the record as read (line text, or the parsed fields as JSON)"),
        ("source", "STRING", "which log the record came from"),
        ("input_path", "STRING", "the file or folder that was ingested"),
        ("reason", "STRING", "why the record was not ingested"),
        ("ingested_at", "TIMESTAMP", "when the ingest run saw it, UTC"),
    ),
    primary_key=("source", "input_path", "raw", "reason"),
    partition_by=("source",),
)

INGEST_RUNS = TableSpec(
    name="ingest_runs",
    description="One row per ingest run: rows in, rows written per table, rows quarantined.",
    columns=(
        ("run_id", "STRING", "source plus input path plus the ingested time range"),
        ("source", "STRING", "which log"),
        ("input_path", "STRING", "what was read"),
        ("records_in", "BIGINT", "records read from the input"),
        ("request_rows", "BIGINT", "rows written to request_log"),
        ("requests", "BIGINT", "distinct requests written"),
        ("event_rows", "BIGINT", "rows written to user_events"),
        ("item_rows", "BIGINT", "rows written to items"),
        ("quarantined", "BIGINT", "records written to request_log_quarantine"),
        ("min_ts", "TIMESTAMP", "earliest request time ingested"),
        ("max_ts", "TIMESTAMP", "latest request time ingested"),
        ("seconds", "DOUBLE", "wall time of the run"),
        ("finished_at", "TIMESTAMP", "when the run committed, UTC"),
    ),
    primary_key=("run_id",),
)

ALL_TABLES: tuple[TableSpec, ...] = (REQUEST_LOG, USER_EVENTS, ITEMS, REQUEST_LOG_QUARANTINE, INGEST_RUNS)
BY_NAME = {t.name: t for t in ALL_TABLES}


def qualified_name(spec: TableSpec, database: str) -> str:
    return f"{database}.{spec.name}"


def ensure_table(spark, spec: TableSpec, cfg) -> str:
    """Create ``spec`` in the catalog as an external Delta table if it is not there; return its name.

    The table's location is fixed by the declaration and the lake root, so a catalog rebuilt from
    scratch finds the same data again.
    """
    name = qualified_name(spec, cfg.lake.database)
    location = cfg.lake.table_path(spec.name)
    partition = f" PARTITIONED BY ({', '.join(spec.partition_by)})" if spec.partition_by else ""
    comments = ", ".join(f"{n} {t} COMMENT '{c.replace(chr(39), '')}'" for n, t, c in spec.columns)
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {name} ({comments}) USING DELTA{partition} "
        f"LOCATION '{location}' COMMENT '{spec.description.replace(chr(39), '')}'"
    )
    return name


def ensure_tables(spark, cfg, specs: tuple[TableSpec, ...] = ALL_TABLES) -> None:
    for spec in specs:
        ensure_table(spark, spec, cfg)


def conform(df, spec: TableSpec):
    """Select and cast ``df``'s columns to exactly the declared schema, in declared order.

    A missing column is an error here, not a column of nulls in the table.
    """
    from pyspark.sql import functions as F

    missing = [n for n in spec.column_names if n not in df.columns]
    if missing:
        raise ValueError(f"{spec.name}: dataframe lacks declared column(s) {missing}; has {df.columns}")
    return df.select([F.col(n).cast(t).alias(n) for n, t, _ in spec.columns])
