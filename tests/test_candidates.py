"""The click-log candidate generator, on tiny DataFrames."""

from datetime import datetime, timedelta

import pytest
from pyspark.sql import functions as F

from include.config import ClickLogConfig
from spark_jobs.candidates import click_pools, clicks_to_requests, leak_statistics

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 5, 0, 0, 0)
SCHEMA = "user_id string, item_id string, ts timestamp, surface string, device string, region string, referrer string"


def clicks(spark, rows):
    return spark.createDataFrame([(u, i, T0 + timedelta(minutes=m), "1", "0", "0", "1") for u, i, m in rows], SCHEMA)


@pytest.fixture
def log(spark):
    # hour 0: i1 x3, i2 x2, i3 x1; hour 1: requests that should draw from hour 0's clicks
    hour0 = [("a", "i1", 1), ("b", "i1", 2), ("c", "i1", 3), ("a", "i2", 4), ("b", "i2", 5), ("c", "i3", 6)]
    hour1 = [("a", "i9", 61), ("b", "i1", 62), ("c", "i4", 63)]
    return clicks(spark, hour0 + hour1)


def test_pool_is_a_sample_of_the_click_events_of_whole_hours_before(spark, log):
    whole = {r.hour: sorted(r.pool) for r in click_pools(log, ClickLogConfig(2, 1, 6)).collect()}
    h0 = int(T0.timestamp() // 3600)
    # pool_size 6 holds hour 0's whole click stream: each item as often as it was clicked
    assert whole[h0 + 1] == ["i1", "i1", "i1", "i2", "i2", "i3"]
    assert h0 not in whole  # nothing before the log: no pool for its first hour
    assert whole[h0 + 2] == ["i1", "i4", "i9"]  # hour 1's clicks only
    small = [{r.hour: r.pool for r in click_pools(log, ClickLogConfig(2, 1, 3, seed=s)).collect()} for s in (1, 1, 2)]
    assert small[0] == small[1] and len(small[0][h0 + 1]) == 3  # seeded: the same sample every run
    for item in set(small[0][h0 + 1]):
        assert small[0][h0 + 1].count(item) <= whole[h0 + 1].count(item)  # a sample of the events, no more


def test_negatives_are_drawn_in_proportion_to_recent_clicks(spark):
    # hour 0: i_a clicked 80 times, i_b 15, i_c 5; hour 1: 600 clicks of other items, one negative each
    hour0 = [(f"u{n}", "i_a" if n < 80 else "i_b" if n < 95 else "i_c", n % 60) for n in range(100)]
    hour1 = [(f"v{n}", f"x{n % 30}", 60 + n % 60) for n in range(600)]
    rows = clicks_to_requests(clicks(spark, hour0 + hour1), ClickLogConfig(1, 1, 1000, seed=5), "s") \
        .where((F.col("label") == 0) & (F.col("ts") >= T0 + timedelta(hours=1))).groupBy("item_id").count().collect()
    share = {r.item_id: r["count"] / 600 for r in rows}
    assert set(share) == {"i_a", "i_b", "i_c"}
    assert 0.74 < share["i_a"] < 0.86 and 0.10 < share["i_b"] < 0.20 and 0.02 < share["i_c"] < 0.09


def test_popularity_and_position_alone_do_not_separate_the_labels(spark):
    """On a log whose items keep their popularity, prior popularity and position carry ~no signal."""
    import numpy as np

    rng = np.random.default_rng(11)
    weights = rng.pareto(1.2, 60) + 0.1
    items = rng.choice(60, 3000, p=weights / weights.sum())
    log = clicks(spark, [(f"u{n % 400}", f"i{it}", int(n * 180 / 3000)) for n, it in enumerate(items)])
    requests = clicks_to_requests(log, ClickLogConfig(9, 1, 1000, seed=7), "s").where(F.col("ts") >= T0 + timedelta(hours=1))
    leak = leak_statistics(requests, log)
    assert 0.40 <= leak["popularity_auc"] <= 0.65, leak
    assert 0.45 <= leak["position_auc"] <= 0.55, leak


def test_each_click_is_one_request_with_one_positive(spark, log):
    rows = clicks_to_requests(log, ClickLogConfig(2, 1, 6, seed=1), "syn").collect()
    by_request = {}
    for r in rows:
        by_request.setdefault(r.request_id, []).append(r)
    assert len(by_request) == 9
    for rid, cands in by_request.items():
        assert sum(c.label for c in cands) == 1
        assert sorted(c.position for c in cands) == list(range(len(cands)))
        assert len({c.item_id for c in cands}) == len(cands)
        clicked = rid.split(":")[-1]
        assert [c.item_id for c in cands if c.label == 1] == [clicked]
    hour1 = {rid: c for rid, c in by_request.items() if c[0].ts >= T0 + timedelta(hours=1)}
    assert len(hour1) == 3
    for rid, cands in hour1.items():
        assert len(cands) == 3  # the click plus K=2 negatives
        negatives = {c.item_id for c in cands if c.label == 0}
        assert negatives <= {"i1", "i2", "i3"}  # drawn from hour 0's clicks only
    hour0 = [c for rid, c in by_request.items() if c[0].ts < T0 + timedelta(hours=1)]
    assert all(len(c) == 1 for c in hour0)  # no preceding window: the click alone


def test_same_seed_same_requests_other_seed_differs(spark):
    hour0 = [(f"u{n}", f"i{n % 20}", n % 60) for n in range(200)]
    hour1 = [(f"u{n}", f"i{n % 7}", 60 + n % 60) for n in range(50)]
    df = clicks(spark, hour0 + hour1)
    p = ClickLogConfig(5, 1, 15, seed=3)
    cols = ["request_id", "item_id", "position", "label", "ts"]
    a = clicks_to_requests(df, p, "s").select(cols).orderBy(cols).collect()
    b = clicks_to_requests(df, p, "s").select(cols).orderBy(cols).collect()
    c = clicks_to_requests(df, ClickLogConfig(5, 1, 15, seed=4), "s").select(cols).orderBy(cols).collect()
    assert a == b
    assert a != c
    # the clicked item's slot is spread over positions, so position does not give the label away
    slots = {r.position for r in a if r.label == 1 and r.ts >= T0 + timedelta(hours=1)}
    assert len(slots) >= 4


def test_prior_clicks_make_incremental_ingest_match_whole(spark, log):
    p = ClickLogConfig(2, 1, 6, seed=1)
    cols = ["request_id", "item_id", "position", "label"]
    whole = clicks_to_requests(log, p, "s").where(F.col("ts") >= T0 + timedelta(hours=1)).select(cols).orderBy(cols).collect()
    first, second = log.where(F.col("ts") < T0 + timedelta(hours=1)), log.where(F.col("ts") >= T0 + timedelta(hours=1))
    incremental = clicks_to_requests(second, p, "s", prior_clicks=first).select(cols).orderBy(cols).collect()
    assert incremental == whole


@pytest.mark.parametrize("kwargs", [dict(negatives_per_click=-1), dict(window_hours=0),
                                    dict(negatives_per_click=10, pool_size=5)])
def test_bad_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ClickLogConfig(**kwargs)
