"""great-expectations checks on request_log: a failure names the expectation and its counts."""

import json
from datetime import datetime

import pytest

from feature_store.quality import DataQualityError, validate_request_log
from feature_store.tables import REQUEST_LOG, REQUEST_LOG_QUARANTINE
from spark_jobs.ingest_load import write_ingest

pytestmark = pytest.mark.spark

T = datetime(2026, 1, 5, 10)


def rows(spark, data):
    base = dict(ts=T, position=0, label=1, surface=None, device=None, region=None, referrer=None,
                source="t", date=T.date(), hour=10)
    return spark.createDataFrame([{**base, **d} for d in data], REQUEST_LOG.schema())


def test_clean_rows_pass_and_the_report_is_saved(spark, make_cfg):
    cfg = make_cfg("gx_ok")
    df = rows(spark, [dict(request_id="r1", user_id="u", item_id="a"),
                      dict(request_id="r1", user_id="u", item_id="b", position=1, label=0),
                      dict(request_id="r2", user_id="u", item_id="a", label=None)])
    path = validate_request_log(df, cfg, "ok")
    report = json.loads(open(path).read())
    assert report["success"] is True and report["failures"] == []


def test_each_broken_rule_is_named_with_counts(spark, make_cfg):
    cfg = make_cfg("gx_bad", quality={"max_candidates_per_request": 2})
    df = rows(spark, [
        dict(request_id="r1", user_id="u", item_id="a", label=2),  # label outside {0,1}
        dict(request_id="r1", user_id="u", item_id="a"),  # duplicate (request_id, item_id)
        dict(request_id="r1", user_id="u", item_id="c"),  # third candidate: over the bound of 2
        dict(request_id="r2", user_id=None, item_id="a", ts=datetime(1960, 1, 1)),  # null key, ts before 1970
    ])
    with pytest.raises(DataQualityError) as e:
        validate_request_log(df, cfg, "bad")
    msg = str(e.value)
    assert len(e.value.failures) == 5
    assert "expect_column_values_to_not_be_null({'column': 'user_id'}): element_count=4, unexpected_count=1" in msg
    assert "expect_column_values_to_be_in_set({'column': 'label', 'value_set': [0, 1]}): element_count=4, unexpected_count=1" in msg
    assert "expect_column_values_to_be_between({'column': 'ts'" in msg and "examples=['1960-01-01T00:00:00']" in msg
    assert "expect_compound_columns_to_be_unique({'column_list': ['request_id', 'item_id']}): element_count=4, unexpected_count=2" in msg
    assert "[request_log_requests] expect_column_values_to_be_between({'column': 'candidates'" in msg and "examples=[3]" in msg
    saved = json.loads(open(e.value.report_path).read())
    assert saved["success"] is False and len(saved["failures"]) == 5


def test_failed_validation_writes_nothing(spark, make_cfg):
    cfg = make_cfg("gx_nowrite")
    bad = rows(spark, [dict(request_id="r1", user_id="u", item_id="a", label=7)])
    events = spark.createDataFrame([], "user_id string, item_id string, ts timestamp, event_type string, source string, date date")
    quarantine = spark.createDataFrame([], REQUEST_LOG_QUARANTINE.schema())
    with pytest.raises(DataQualityError):
        write_ingest(spark, cfg, source="t", input_path="p", records_in=1, requests=bad, events=events,
                     items=None, quarantine=quarantine, started=0.0)
    assert spark.table(f"{cfg.lake.database}.request_log").count() == 0
    assert spark.table(f"{cfg.lake.database}.ingest_runs").count() == 0
