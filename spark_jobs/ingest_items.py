"""Item attribute files (CSV or Parquet) into rows for the ``items`` table.

    item_id[,category][,subcategory][,title]     (other columns are ignored; names may be mapped)

Used by the impression-log and click-log adapters (``--items PATH``). A row without an item id,
or repeating an item id already seen in the file, lands in the quarantine with its reason; the
first row of an item wins. Item attributes are taken as static: an item's category is the same at
every time, so reading them needs no point-in-time care.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

ATTRIBUTES = ("category", "subcategory", "title")


def parse_items(raw: DataFrame, source: str, mapping: dict[str, str] | None = None) -> DataFrame:
    """Raw string columns -> item_id, attributes, source, raw, reason (null when the row is good)."""
    from spark_jobs.raw_input import RAW, InputError, data_columns, malformed

    m = {"item_id": "item_id", **{a: a for a in ATTRIBUTES}, **(mapping or {})}
    have = data_columns(raw)
    if m["item_id"] not in have:
        raise InputError(f"item file lacks an item id column {m['item_id']!r}; it has {have}")
    col = lambda c: F.trim(F.col(f"`{m[c]}`")) if m[c] in have else F.lit(None).cast("string")  # noqa: E731
    reason = (malformed(raw, "malformed item record: wrong number of fields")
              .when(col("item_id").isNull() | (col("item_id") == ""), F.lit("missing item_id")))
    parsed = raw.select(col("item_id").alias("item_id"), *[F.nullif(col(a), F.lit("")).alias(a) for a in ATTRIBUTES],
                        F.col(RAW).alias("raw"), reason.alias("reason"))
    w = Window.partitionBy("item_id", F.col("reason").isNull()).orderBy("raw")
    first = F.when(F.col("reason").isNull(), F.row_number().over(w))
    return (parsed.withColumn("_n", first)
            .withColumn("reason", F.when(F.col("_n") > 1, F.lit("repeated item_id in item file")).otherwise(F.col("reason")))
            .drop("_n").withColumn("source", F.lit(source)))


def read_items(spark, path: str, source: str, fmt: str = "csv") -> DataFrame:
    """The item file at ``path`` parsed (see ``parse_items``), with its blank and over-wide lines as
    rows with a reason and no item."""
    from spark_jobs.raw_input import read_raw

    raw = read_raw(spark, path, fmt)
    return parse_items(raw.records, source).unionByName(raw.lines.withColumn("source", F.lit(source)),
                                                        allowMissingColumns=True)
