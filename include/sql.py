"""SQL over the SOLARIS tables: ``python -m include.sql "SELECT count(*) FROM solaris.request_log"``.

Uses the same session factory as the jobs, so every table in the catalog answers by name.
``--file`` runs the statements of a .sql file (separated by ``;``); ``--max-rows`` bounds what is
printed; ``--json`` prints one JSON object per row instead of a table.

Read-only unless ``--write``: a statement that is not a query (SELECT, WITH ... SELECT, SHOW,
DESCRIBE, EXPLAIN, VALUES, TABLE) is refused in one line before Spark starts, so a typo or a pasted
DELETE, DROP or ``VACUUM ... RETAIN 0 HOURS`` cannot remove what the jobs wrote.
"""

from __future__ import annotations

import argparse
import json
import re
import sys


def split_statements(text: str) -> list[str]:
    """Split on ``;`` outside quotes, dropping ``--`` comment lines and empty statements."""
    out, buf, quote = [], [], None
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    for ch in "\n".join(lines):
        if quote:
            quote = None if ch == quote else quote
        elif ch in ("'", '"', "`"):
            quote = ch
        elif ch == ";":
            out.append("".join(buf).strip())
            buf = []
            continue
        buf.append(ch)
    out.append("".join(buf).strip())
    return [s for s in out if s]


READS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "VALUES", "TABLE", "FROM")
WRITES_IN_A_QUERY = re.compile(r"\b(INSERT|MERGE|UPDATE|DELETE|OVERWRITE)\b", re.IGNORECASE)


def write_problem(statement: str) -> str | None:
    """Why ``statement`` is not a read, or None. Quoted text and comments are not looked at."""
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`", "''", statement)
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL).strip().lstrip("(").strip()
    first = (text.split(None, 1) or [""])[0].upper()
    if first not in READS:
        return f"{first or 'an empty statement'} is not a query"
    if first in ("WITH", "FROM") and (m := WRITES_IN_A_QUERY.search(text)):
        return f"it writes ({m.group(1).upper()})"
    return None


def run(spark, statement: str, max_rows: int = 50, as_json: bool = False) -> int:
    df = spark.sql(statement)
    if not df.columns:  # DDL / DML: nothing to show
        return 0
    rows = df.limit(max_rows + 1).collect()
    if as_json:
        for r in rows[:max_rows]:
            print(json.dumps(r.asDict(recursive=True), default=str))
    else:
        df.show(max_rows, truncate=60)
    if len(rows) > max_rows:
        print(f"(showing the first {max_rows} rows; --max-rows for more)", file=sys.stderr)
    return len(rows[:max_rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m include.sql", description=__doc__.split("\n\n")[0])
    p.add_argument("query", nargs="?", help="one SQL statement")
    p.add_argument("--file", help="a .sql file of statements separated by ';'")
    p.add_argument("--max-rows", type=int, default=50)
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--config", help="SOLARIS TOML config")
    p.add_argument("--write", action="store_true",
                   help="allow statements that change tables (INSERT, DELETE, DROP, VACUUM, ...); default read-only")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(a.query) == bool(a.file):
        p.error("give one SQL statement or --file, not both or neither")
    statements = split_statements(open(a.file).read()) if a.file else [a.query]
    if not a.write:
        for s in statements:
            if (problem := write_problem(s)) is not None:
                print(f"error: refused, read-only: {problem}: {' '.join(s.split())[:120]}; "
                      f"pass --write to change tables", file=sys.stderr)
                return 2

    from pyspark.errors import AnalysisException

    from include.config import load_config
    from include.spark import get_spark

    spark = get_spark(load_config(a.config))
    try:
        for s in statements:
            if a.file:  # one line per statement, so the output reads (and parses) statement by statement
                print("-- " + " ".join(s.split()))
            run(spark, s, a.max_rows, a.json)
    except AnalysisException as e:
        print(f"SQL error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
