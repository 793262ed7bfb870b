"""Read an input log as string records, each with its own text, and account for every line.

Shared by the click-log, impression and item ingests. A CSV input is read so that no line is lost
or invented:
- quoted fields may hold newlines: a file that has one is parsed by records (one task per file),
  the others by lines (split across tasks);
- a line of more fields than the parser can hold (``MAX_FIELDS``) is quarantined alone, instead of
  failing its whole file;
- blank lines, which the CSV reader skips, are quarantined, so every line is counted;
- a U+FFFD is "undecodable bytes" only where the file holds bytes that are not valid UTF-8: the
  text itself may carry the character.
Each record carries ``RAW``, its text for the quarantine: as read where the parser could not split
it, else the record written back as one CSV line in the header's column order, which the same
reader parses to the same fields (header + quarantined lines re-ingest the records).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

CORRUPT = "_corrupt_record"  # the CSV reader's column for a record it could not split
RAW = "_solaris_raw"  # the record's text (see the module docstring)
UNDECODED = "_solaris_undecoded"  # the record shows bytes its encoding could not decode
HELPER_COLUMNS = (CORRUPT, RAW, UNDECODED)
UNDECODABLE = "\ufffd"  # what a byte that is not valid in the read encoding becomes
# The CSV parser allocates one slot per column up front: a line of more fields than this is
# quarantined before parsing. A line needs at least one character per field, so only lines at least
# this long are counted.
MAX_FIELDS = 1_000_000
WIDE_LINE = f"line of more than {MAX_FIELDS:,} fields"
BLANK = r"^\s*$"  # a line of only whitespace: no record (the scan quarantines it as a blank line)


class InputError(ValueError):
    """The input cannot be ingested at all (missing path, no columns, unmapped required column)."""


@dataclass
class RawInput:
    """``records``: the input's columns as strings, plus HELPER_COLUMNS; ``lines``: (raw, reason)
    of the lines no record holds (blank lines, over-wide lines), to quarantine; ``scan``: what
    ``lines`` is read from, kept in memory until ``release``."""

    records: DataFrame
    lines: DataFrame
    scan: DataFrame | None = None

    def release(self) -> None:
        if self.scan is not None:
            self.scan.unpersist()


def data_columns(raw: DataFrame) -> list[str]:
    return [c for c in raw.columns if c not in HELPER_COLUMNS]


def malformed(raw: DataFrame, reason: str):
    """A ``when`` chain starting with the records the parser could not split, then the undecodable
    ones; parsers append their own checks to it."""
    chain = F.when(F.col(CORRUPT).isNotNull(), F.lit(reason)) if CORRUPT in raw.columns \
        else F.when(F.lit(False), F.lit(None))
    return chain.when(F.col(UNDECODED), F.lit(f"undecodable bytes: {raw_encoding(raw)}"))


def raw_encoding(raw: DataFrame) -> str:
    return raw.schema[UNDECODED].metadata.get("hint", "not valid text, give --encoding")


def read_error(path: str, fmt: str, e: Exception) -> InputError:
    """A failed read (truncated gzip, an unreadable file) as one clear line naming its cause."""
    text = str(e)
    causes = [line.split("Caused by: ", 1)[1] for line in text.splitlines() if "Caused by: " in line]
    cause = causes[-1] if causes else text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return InputError(f"{path}: cannot be read as {fmt}: {cause[:300]}")


def require_path(spark, path: str) -> None:
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    matches = fs.globStatus(hpath)
    if matches is None or len(matches) == 0:
        raise InputError(f"input path does not exist: {path}")


def _utf8(encoding: str) -> bool:
    return encoding.replace("-", "").replace("_", "").lower() in ("utf8", "ascii")


def _scan_lines(spark, path: str, utf8: bool) -> DataFrame:
    """One pass over the input's lines, keeping only those that matter: blank, over-wide, (UTF-8)
    holding invalid bytes, or with an odd number of quotes (a quoted field that goes on past the
    line's end). Columns: file, value (blank and wide lines only), wide, invalid, blank, open_quote."""
    text = spark.read.text(path).select(F.col("_metadata.file_path").alias("file"), "value")
    wide = (F.length("value") >= MAX_FIELDS) & (F.size(F.split("value", ",")) > MAX_FIELDS)
    invalid = ~F.is_valid_utf8("value") if utf8 else F.lit(False)
    blank = F.col("value").rlike(BLANK)
    open_quote = (F.length("value") - F.length(F.translate("value", '"', ""))) % 2 == 1
    return (text.select("file", "value", wide.alias("wide"), invalid.alias("invalid"), blank.alias("blank"),
                        open_quote.alias("open_quote"))
            .where("wide OR invalid OR blank OR open_quote")
            .select("file", F.when(F.col("wide") | F.col("blank"), F.col("value")).alias("value"), "wide", "invalid",
                    "blank", "open_quote"))


def _file_key(uri: str) -> str:
    """One spelling of a file's URI ("file:/x" and "file:///x" are one local file)."""
    from urllib.parse import urlparse

    return urlparse(uri).path if uri.startswith("file:") else uri


def read_raw(spark, path: str, fmt: str, encoding: str = "utf-8") -> RawInput:
    """Every column as a string (see the module docstring for what CSV reading guarantees)."""
    require_path(spark, path)
    if fmt == "parquet":
        df = spark.read.parquet(path)
        if not df.columns:
            raise InputError(f"{path}: parquet input has no columns")
        strings = df.select([F.col(f"`{c}`").cast("string").alias(c) for c in df.columns])
        records = strings.select("*", F.to_json(F.struct(*[F.col(f"`{c}`") for c in strings.columns])).alias(RAW),
                                 F.lit(False).alias(UNDECODED))
        return RawInput(records, records.limit(0).select(F.col(RAW).alias("raw"), F.lit("").alias("reason")))
    if fmt != "csv":
        raise InputError(f"format must be csv or parquet, got {fmt!r}")
    utf8 = _utf8(encoding)
    # Files are parsed by lines, which Spark splits across tasks, except where that would cut a record:
    # a file with a quoted field that holds a newline is parsed by records (multiLine, one task per
    # file), and outside UTF-8 every file is read whole and decoded (Spark splits lines on the byte
    # 0x0A before decoding, which cuts multi-byte encodings such as UTF-16 mid-character).
    reader = (spark.read.option("header", True).option("encoding", encoding).option("multiLine", not utf8)
              .option("maxColumns", MAX_FIELDS))
    scan = _scan_lines(spark, path, utf8).persist()
    try:
        flagged = (scan.where("wide OR invalid OR open_quote").groupBy("file")
                   .agg(*[F.max(c).alias(c) for c in ("wide", "invalid", "open_quote")]).collect())
        header = reader.csv(path).columns
    except Exception as e:  # a truncated gzip, an unreadable file
        scan.unpersist()
        raise read_error(path, fmt, e) from e
    if not header:
        scan.unpersist()
        raise InputError(f"{path}: CSV input is empty (no header line)")
    if any("\x00" in c or UNDECODABLE in c for c in header):
        scan.unpersist()
        raise InputError(f"{path}: the header is not {encoding} text (UTF-16? binary?): give --encoding, "
                         f"e.g. --encoding utf-16")
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField(c, StringType()) for c in header] + [StructField(CORRUPT, StringType())])
    permissive = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT).schema(schema)
    wide = {_file_key(r.file): r.file for r in flagged if r.wide}
    whole = {_file_key(r.file) for r in flagged if r.open_quote and not r.wide}
    invalid_files = [r.file for r in flagged if r.invalid]
    with_file = lambda df: df.select("*", F.col("_metadata.file_path").alias("_file"))  # noqa: E731
    if not wide and not whole:
        records = with_file(permissive.csv(path))
    else:
        files = spark.read.text(path).inputFiles()
        parts = []
        by_lines = [f for f in files if _file_key(f) not in wide and _file_key(f) not in whole]
        if by_lines:
            parts.append(with_file(permissive.csv(by_lines)))
        if whole:
            parts.append(with_file(permissive.option("multiLine", True).csv([f for f in files if _file_key(f) in whole])))
        if wide:
            # parsed from their lines without the over-wide ones (which the scan quarantines)
            lines = (spark.read.text(list(wide.values())).select(F.col("_metadata.file_path").alias("file"), "value")
                     .join(scan.where("wide").select("file", "value"), ["file", "value"], "left_anti"))
            narrow = permissive.option("multiLine", False).csv(lines.select("value").rdd.map(lambda r: r.value))
            parts.append(narrow.withColumn("_file", F.lit(next(iter(wide.values())) if len(wide) == 1 else None)))
        records = parts[0]
        for part in parts[1:]:
            records = records.unionByName(part)
    undecoded_file = F.col("_file").isin(invalid_files) | (F.col("_file").isNull() & F.lit(bool(invalid_files)))
    # Reading records, the parser returns a whitespace-only line as a one-field record: the scan
    # has it already, as a blank line.
    records = records.where(F.col(CORRUPT).isNull() | ~F.col(CORRUPT).rlike(BLANK))
    columns = [F.col(f"`{c}`") for c in header]
    # Leading and trailing spaces are part of the record: written back as read.
    text = F.to_csv(F.struct(*columns), {"ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false"})
    shows = F.coalesce(F.col(CORRUPT), text).contains(UNDECODABLE)
    # Outside UTF-8 the scan cannot tell (its lines are not decoded): any U+FFFD counts.
    undecoded = (shows & undecoded_file) if utf8 else shows
    hint = f"not {encoding} text, give --encoding"
    records = records.select(*columns, CORRUPT, F.coalesce(F.col(CORRUPT), text).alias(RAW),
                             undecoded.alias(UNDECODED, metadata={"hint": hint}))
    quarantined = scan.where("wide OR blank").select(
        F.col("value").alias("raw"), F.when(F.col("wide"), F.lit(WIDE_LINE)).otherwise(F.lit("blank line")).alias("reason"))
    return RawInput(records, quarantined, scan)


def count_records(spark, parsed: DataFrame, raw: RawInput, path: str, fmt: str) -> int:
    """Records read, including the lines no record holds (blank, over-wide). A read that fails here
    (a truncated gzip, a file that is no CSV) is one clear ``InputError``."""
    try:
        n = parsed.count()
        n_lines = raw.lines.count()
    except Exception as e:
        raise read_error(path, fmt, e) from e
    if n == 0:
        raise InputError(f"{path}: input has a header but no records")
    return n + n_lines
