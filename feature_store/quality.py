"""Data-quality checks with great-expectations, run on Spark DataFrames before they are written.

A failed check raises ``DataQualityError`` naming each failed expectation with its counts, and
the full validation result is saved as JSON under ``<lake>/quality/<table>/<run>.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store import lake

log = logging.getLogger(__name__)


def non_finite(col: str = "embedding"):
    """Column: the array holds a NaN or an infinity."""
    return F.exists(col, lambda x: F.isnan(x) | (F.abs(x) == float("inf")))


def valid_embedding(dim: int, col: str = "embedding"):
    """Column: the array is exactly ``dim`` finite floats, what every embedding table must hold."""
    return (F.size(col) == dim) & ~non_finite(col)


class DataQualityError(RuntimeError):
    """A dataset failed one or more expectations; the message names them and their counts."""

    def __init__(self, table: str, failures: list[str], report_path: str):
        self.table, self.failures, self.report_path = table, failures, report_path
        super().__init__(f"{table} failed {len(failures)} expectation(s) (full report: {report_path}):\n  "
                         + "\n  ".join(failures))


def _context():
    import great_expectations as gx

    from great_expectations.data_context.types.base import ProgressBarsConfig

    # Ephemeral: expectations are defined in code (here), results are saved by us as JSON.
    context = gx.get_context(mode="ephemeral")
    # No progress bars: the job prints its own lines, and a bar per metric batch interleaves with
    # them (and with Spark's) in a log.
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def _run_suite(name: str, df: DataFrame, expectations: list) -> dict:
    import great_expectations as gx

    context = _context()
    # Each expectation is one or more Spark queries over ``df``: computed once, not once per query.
    df = df.persist()
    try:
        batch = (context.data_sources.add_spark(name=f"{name}_source")
                 .add_dataframe_asset(name=name)
                 .add_batch_definition_whole_dataframe(f"{name}_batch")
                 .get_batch(batch_parameters={"dataframe": df}))
        suite = context.suites.add(gx.ExpectationSuite(name=f"{name}_suite", expectations=expectations))
        return batch.validate(suite).to_json_dict()
    finally:
        df.unpersist()


def _describe_failure(r: dict) -> str:
    cfg = r["expectation_config"]
    kwargs = {k: v for k, v in cfg.get("kwargs", {}).items() if k not in ("batch_id",)}
    res = r.get("result", {})
    counts = ", ".join(f"{k}={res[k]}" for k in ("element_count", "unexpected_count", "unexpected_percent",
                                                  "observed_value") if k in res)
    sample = res.get("partial_unexpected_list")
    exc = r.get("exception_info", {})
    extra = f", examples={sample[:5]}" if sample else ""
    if exc.get("raised_exception"):
        extra += f", error={exc.get('exception_message')}"
    return f"{cfg['type']}({kwargs}): {counts}{extra}"


def validate(table: str, checks: dict[str, tuple[DataFrame, list]], out_dir: Path, run_name: str) -> str:
    """Run each (dataframe, expectations) suite; save all results; raise if any failed."""
    results, failures = {}, []
    for name, (df, expectations) in checks.items():
        res = _run_suite(name, df, expectations)
        results[name] = res
        failures += [f"[{name}] {_describe_failure(r)}" for r in res["results"] if not r["success"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{run_name}.json"
    path.write_text(json.dumps({"table": table, "success": not failures, "failures": failures,
                                "suites": results}, indent=1, default=str))
    if failures:
        raise DataQualityError(table, failures, str(path))
    log.info("%s passed %d suite(s); report %s", table, len(checks), path)
    return str(path)


def request_log_checks(df: DataFrame, cfg) -> dict[str, tuple[DataFrame, list]]:
    """The request_log expectations: keys, labels, time range, candidates per request, uniqueness."""
    import great_expectations.expectations as gxe

    q = cfg.quality
    rows = [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("request_id", "user_id", "item_id", "ts")]
    rows += [
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=[0, 1]),  # nulls are allowed: unknown
        gxe.ExpectColumnValuesToBeBetween(column="ts", min_value=q.min_ts, max_value=q.max_ts),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["request_id", "item_id"]),
    ]
    per_request = df.groupBy("request_id").agg(F.count(F.lit(1)).alias("candidates"))
    requests = [gxe.ExpectColumnValuesToBeBetween(column="candidates", min_value=1,
                                                  max_value=q.max_candidates_per_request)]
    return {"request_log_rows": (df, rows), "request_log_requests": (per_request, requests)}


def validate_request_log(df: DataFrame, cfg, run_name: str) -> str:
    return validate("request_log", request_log_checks(df, cfg), cfg.lake.quality_path / "request_log", run_name)


def feature_table_checks(spark, cfg, t, dim: int) -> dict[str, tuple[DataFrame, list]]:
    """The serving tables as the run at t left them: embeddings of ``dim`` finite floats, expiry
    after computation, sane neighbor rows, and coverage of the past hour above the configured floor."""
    from datetime import timedelta

    import great_expectations.expectations as gxe

    db, run_id = cfg.lake.database, lake.run_id(t)

    def embedding_rows(name: str) -> DataFrame:
        return (spark.table(f"{db}.{name}").where(F.col("run_id") == run_id)
                .select(F.size("embedding").alias("dim"),
                        non_finite().alias("non_finite"),
                        (F.col("expires_at").cast("long") - F.col("computed_at").cast("long")).alias("ttl_seconds")))

    def embedding_checks() -> list:
        return [gxe.ExpectColumnValuesToBeBetween(column="dim", min_value=dim, max_value=dim),
                gxe.ExpectColumnValuesToBeInSet(column="non_finite", value_set=[False]),
                gxe.ExpectColumnValuesToBeBetween(column="ttl_seconds", min_value=1)]

    neighbors = (spark.table(f"{db}.user_neighbors").where(F.col("run_id") == run_id)
                 .select("rank", "similarity", (F.col("user_id") == F.col("neighbor_id")).alias("is_self")))
    start = t - timedelta(hours=1)
    features = spark.table(f"{db}.request_features").where((F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(t)))
    coverage = features.agg(F.coalesce(F.avg((F.col("tier") != "none").cast("double")), F.lit(1.0)).alias("covered"))
    q = cfg.quality
    return {
        "pair_embeddings": (embedding_rows("pair_embeddings"), embedding_checks()),
        "user_mean_embeddings": (embedding_rows("user_mean_embeddings"), embedding_checks()),
        "item_mean_embeddings": (embedding_rows("item_mean_embeddings"), embedding_checks()),
        "user_neighbors": (neighbors, [gxe.ExpectColumnValuesToBeBetween(column="rank", min_value=1),
                                       gxe.ExpectColumnValuesToBeBetween(column="similarity", min_value=-1.001,
                                                                         max_value=1.001),
                                       gxe.ExpectColumnValuesToBeInSet(column="is_self", value_set=[False])]),
        "coverage": (coverage, [gxe.ExpectColumnValuesToBeBetween(column="covered", min_value=q.min_coverage,
                                                                  max_value=1.0)]),
    }


def validate_feature_tables(spark, cfg, t, dim: int) -> str:
    return validate("feature_tables", feature_table_checks(spark, cfg, t, dim), cfg.lake.quality_path / "feature_tables",
                    lake.run_id(t).replace(":", ""))
