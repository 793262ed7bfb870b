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
