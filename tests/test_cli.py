"""The shared command-line plumbing of the per-interval jobs (include/cli.py)."""

from include.cli import WRITE_CONFLICT, parse_time, write_conflict


def test_a_delta_commit_conflict_is_recognised_by_its_exception_and_first_line():
    # As py4j renders it: the Java exception class, its message, then the stack trace.
    java = ("py4j.protocol.Py4JJavaError: An error occurred while calling o581.save.\n"
            ": io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] "
            "Transaction conflict detected.\n\tat org.apache.spark.sql.delta.Foo.bar(Foo.scala:1)")
    assert write_conflict(Exception(java)) == ("ConcurrentAppendException: [DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] "
                                               "Transaction conflict detected.")
    assert write_conflict(Exception("io.delta.exceptions.MetadataChangedException: the schema changed")) \
        == "MetadataChangedException: the schema changed"
    # Anything else is not a lost race and must surface as the error it is.
    assert write_conflict(Exception("AnalysisException: Table or view not found")) is None
    assert write_conflict(Exception("io.delta.exceptions.DeltaAnalysisException: bad column")) is None
    assert WRITE_CONFLICT not in (0, 1, 2)  # distinct from success, a crash and a usage error


def test_times_are_naive_utc():
    assert parse_time("2026-01-05T13:00:00+01:00").isoformat() == "2026-01-05T12:00:00"


def test_the_sql_entry_point_is_read_only_unless_told(tmp_path, capsys):
    """DELETE, DROP, VACUUM ... RETAIN 0 and a CTE that inserts are refused in one line before any
    Spark session starts (exit 2, nothing touched); queries pass the check; --write lets them all."""
    from include.sql import main, write_problem

    for statement in ("DELETE FROM solaris.request_log", "DROP TABLE solaris.pair_embeddings",
                      "VACUUM solaris.pair_embeddings RETAIN 0 HOURS",
                      "WITH x AS (SELECT 1) INSERT INTO solaris.items SELECT * FROM x"):
        assert main([statement]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: refused, read-only") and "--write" in err and len(err.splitlines()) == 1
    queries = tmp_path / "q.sql"
    queries.write_text("SELECT 1;\nSHOW TABLES IN solaris;\nDELETE FROM solaris.items;\n")
    assert main(["--file", str(queries)]) == 2 and "DELETE is not a query" in capsys.readouterr().err
    for statement in ("SELECT 'delete me' FROM solaris.items", "WITH a AS (SELECT 1) SELECT * FROM a",
                      "DESCRIBE HISTORY solaris.items", "-- a note\nSELECT 1", "EXPLAIN DELETE FROM t"):
        assert write_problem(statement) is None, statement
