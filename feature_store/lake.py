"""The one way to read and write a declared table (feature_store/tables.py).

Spark side (the jobs): ``upsert`` MERGEs on the table's declared primary key, ``replace`` swaps the
rows of a partition or key range in one transaction (``replaceWhere``), ``overwrite`` replaces the
whole table, ``delete_expired`` removes rows whose validity ended. Each is one Delta transaction,
so a killed job leaves the table at its previous version or its new one.

Arrow side (the lookup, the models, the tests): ``read_arrow`` reads a table, or one version of
it, with delta-rs, by its declaration rather than by a path string, and ``arrow_schema`` is the
Arrow form of the declared schema.

The validity rule every reader applies, ``computed_at <= t < expires_at``, is ``valid_at``; the
run id of an interval is ``run_id``; "now" in UTC is ``utc_now``. All Spark imports are inside
the functions: the lookup imports this module without Spark.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from feature_store.tables import TableSpec, qualified_name


def run_id(t: datetime) -> str:
    """The id of the run for the interval ending at ``t``: its ISO time to the second (2026-01-05T12:00:00)."""
    return t.isoformat(timespec="seconds")


def utc_now() -> datetime:
    """Wall-clock now, naive UTC (the tables' convention). Bookkeeping only: no job selects data by it."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def as_utc(t: datetime) -> datetime:
    """``t`` as an aware UTC time; a naive time is UTC already (the tables' convention)."""
    return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)


def valid_at(t, computed_at: str = "computed_at", expires_at: str = "expires_at"):
    """The Spark condition of a row valid at ``t``: ``computed_at <= t < expires_at`` (the array form,
    for the lookup, is ``feature_store.resolution.valid_at``)."""
    from pyspark.sql import functions as F

    return (F.col(computed_at) <= F.lit(t)) & (F.col(expires_at) > F.lit(t))


def location(cfg, spec: TableSpec) -> str:
    return str(cfg.lake.table_path(spec.name))


def upsert(spark, cfg, spec: TableSpec, df, update: bool = True) -> None:
    """MERGE ``df`` into ``spec``'s table on its declared primary key: matched rows are replaced
    (unless ``update=False``: then only new keys are inserted), new keys inserted. A key twice in
    ``df`` fails the MERGE, as Delta does: callers deduplicate where their input can repeat."""
    from delta.tables import DeltaTable

    cond = " AND ".join(f"t.{k} <=> s.{k}" for k in spec.primary_key)
    merge = DeltaTable.forName(spark, qualified_name(spec, cfg.lake.database)).alias("t").merge(df.alias("s"), cond)
    if update:
        merge = merge.whenMatchedUpdateAll()
    merge.whenNotMatchedInsertAll().execute()


def merge_changes(spark, cfg, spec: TableSpec, changes) -> None:
    """Apply ``changes`` (rows of ``spec`` plus a boolean ``_delete``) on the declared primary key,
    in one transaction: a ``_delete`` row removes the table's row of its key, any other row
    replaces or inserts its key's row. Rows of keys not in ``changes`` are not touched."""
    from delta.tables import DeltaTable

    cond = " AND ".join(f"t.{k} <=> s.{k}" for k in spec.primary_key)
    values = {c: f"s.{c}" for c in spec.column_names}
    (DeltaTable.forName(spark, qualified_name(spec, cfg.lake.database)).alias("t").merge(changes.alias("s"), cond)
     .whenMatchedDelete("s._delete").whenMatchedUpdate("NOT s._delete", values)
     .whenNotMatchedInsert("NOT s._delete", values).execute())


def replace(cfg, spec: TableSpec, df, where: str, repartition: bool = False) -> None:
    """Replace the rows matching the SQL predicate ``where`` (a run's partition, a source's time range)
    with ``df``, in one transaction. ``repartition``: one file per table partition."""
    if repartition and spec.partition_by:
        df = df.repartition(*spec.partition_by)
    # By path: a catalog-level overwrite would try to alter the metastore's copy of the schema.
    df.write.format("delta").mode("overwrite").option("replaceWhere", where).save(location(cfg, spec))


def overwrite(cfg, spec: TableSpec, df) -> None:
    """Replace the whole table with ``df`` (a table rebuilt by every run), in one transaction."""
    df.write.format("delta").mode("overwrite").save(location(cfg, spec))


def delete_where(spark, cfg, spec: TableSpec, condition) -> None:
    from delta.tables import DeltaTable

    DeltaTable.forName(spark, qualified_name(spec, cfg.lake.database)).delete(condition)


def delete_before(cfg, spec: TableSpec, column: str, before: datetime) -> int:
    """Delete the rows whose ``column`` is before ``before`` with delta-rs; returns how many went.
    Its conflict check reads the files other writers added meanwhile by their statistics, so
    appends of newer rows commit beside it (Spark's DELETE, on a table without partitions, fails on
    any file appended while it ran). A lost race raises delta-rs's ``CommitFailedError``."""
    from deltalake import DeltaTable

    out = DeltaTable(location(cfg, spec)).delete(f"{column} < '{as_utc(before).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z'")
    return int(out.get("num_deleted_rows", 0) or 0)


def delete_expired(spark, cfg, spec: TableSpec, t: datetime, expires_at: str = "expires_at") -> None:
    """Delete the rows no longer valid at ``t`` (``expires_at <= t``). Readers already skip them."""
    from pyspark.sql import functions as F

    delete_where(spark, cfg, spec, F.col(expires_at) <= F.lit(t))


def latest_version(spark, cfg, spec: TableSpec) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forName(spark, qualified_name(spec, cfg.lake.database)).history(1).first()["version"]


def arrow_schema(spec: TableSpec):
    """The declared schema as Arrow (timestamps in UTC microseconds, as Delta stores them)."""
    import pyarrow as pa

    simple = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
              "FLOAT": pa.float32(), "BOOLEAN": pa.bool_(), "DATE": pa.date32(),
              "TIMESTAMP": pa.timestamp("us", tz="UTC"), "ARRAY<FLOAT>": pa.list_(pa.float32()),
              "ARRAY<DOUBLE>": pa.list_(pa.float64())}
    return pa.schema([pa.field(n, simple[t.upper()]) for n, t, _ in spec.columns])


def table_path(tables_root: str | Path, spec: TableSpec) -> Path:
    """Where ``spec``'s table lives under a lake's ``tables`` folder (delta-rs readers have no config)."""
    return Path(tables_root) / spec.name


def read_arrow(tables_root: str | Path, spec: TableSpec, version: int | None = None, columns=None, filter=None):
    """``spec``'s table (at ``version``, else the latest) as an Arrow table, read with delta-rs.
    ``columns`` and ``filter`` (a pyarrow.compute expression) are pushed down to the scan.
    ``FileNotFoundError`` names the table when it does not exist yet. Every data page's CRC is
    verified where the file carries one (Spark's Parquet writer always writes them): a flipped
    byte inside a page fails the read instead of being served."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = table_path(tables_root, spec)
    try:
        table = DeltaTable(str(path), version=version)
    except TableNotFoundError as e:
        raise FileNotFoundError(f"table {spec.name} does not exist at {path}") from e
    except Exception as e:  # a damaged log: delta-rs says it as a coloured Rust backtrace naming no table
        raise TableReadError(f"table {spec.name} at {path}"
                             f"{'' if version is None else f' (version {version})'}: {plain_error(e)}") from e
    checked = ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    return table.to_pyarrow_dataset().to_table(columns=columns, filter=filter, fragment_scan_options=checked)


class TableReadError(OSError):
    """A lake table that exists but cannot be read (its log or a file of it is damaged)."""


def plain_error(e: BaseException, limit: int = 300) -> str:
    """``e``'s message as one plain line: terminal colour codes and backtraces cut off."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(e))
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return f"{type(e).__name__}: {first[:limit]}"
