"""The click-log candidate generator, on tiny DataFrames."""

import re
from datetime import datetime, timedelta

import pytest
from pyspark.sql import functions as F

from include.config import ClickLogConfig
from spark_jobs.candidates import click_pools, clicks_to_requests, leak_statistics, pool_windows

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 5, 0, 0, 0)
SCHEMA = "user_id string, item_id string, ts timestamp, surface string, device string, region string, referrer string"


def clicks(spark, rows):
    return spark.createDataFrame([(u, i, T0 + timedelta(minutes=m), "1", "0", "0", "1") for u, i, m in rows], SCHEMA)


@pytest.fixture
def log(spark):
    # hour 0: i1 x3, i2 x2, i3 x1; hour 1: three more clicks
    hour0 = [("a", "i1", 1), ("b", "i1", 2), ("c", "i1", 3), ("a", "i2", 4), ("b", "i2", 5), ("c", "i3", 6)]
    hour1 = [("a", "i9", 61), ("b", "i1", 62), ("c", "i4", 63)]
    return clicks(spark, hour0 + hour1)


def test_pool_windows_widen_forward_only_as_far_as_the_floor_needs():
    counts = {0: 3, 2: 1, 5: 50, 6: 2}
    p = ClickLogConfig(min_pool_clicks=4, max_window_hours=3)
    # at least the own hour and the next; 9: capped at 3 hours after
    assert pool_windows(counts, [0, 2, 5, 9], p) == {0: 2, 2: 5, 5: 6, 9: 12}
    assert pool_windows(counts, [0, 2], ClickLogConfig(min_pool_clicks=1)) == {0: 1, 2: 3}


def test_pool_is_a_sample_of_the_click_events_of_the_hour_and_the_next(spark, log):
    h0 = int(T0.timestamp() // 3600)
    items = lambda pools: {h: sorted(e.item_id for e in pool) for h, pool in pools.items()}  # noqa: E731
    pools = items({r.hour: r.pool for r in click_pools(log, ClickLogConfig(2, pool_size=100)).collect()})
    # the own hour's and the next hour's clicks, each item as often as it was clicked
    assert pools == {h0: ["i1", "i1", "i1", "i1", "i2", "i2", "i3", "i4", "i9"], h0 + 1: ["i1", "i4", "i9"]}
    small = [{r.hour: r.pool for r in click_pools(log, ClickLogConfig(2, pool_size=3, seed=s)).collect()}
             for s in (1, 1, 2)]
    assert small[0] == small[1] and len(small[0][h0]) == 3  # seeded: the same sample every run
    for item in {e.item_id for e in small[0][h0]}:
        assert [e.item_id for e in small[0][h0]].count(item) <= pools[h0].count(item)  # a sample of the events


def test_negatives_are_drawn_in_proportion_to_the_hours_clicks(spark):
    # one hour: i_a clicked 320 times, i_b 60, i_c 20, and 600 clicks of 30 other items, one negative
    # each (among the clicks after each request, the same proportions)
    background = [(f"u{n}", "i_a" if n < 320 else "i_b" if n < 380 else "i_c", n % 60) for n in range(400)]
    targets = [(f"v{n}", f"x{n % 30}", n % 60) for n in range(600)]
    rows = clicks_to_requests(clicks(spark, background + targets), ClickLogConfig(1, pool_size=1000, seed=5), "s") \
        .where((F.col("label") == 0) & F.col("item_id").startswith("i_")).groupBy("item_id").count().collect()
    n = {r.item_id: r["count"] for r in rows}
    total = sum(n.values())
    assert set(n) == {"i_a", "i_b", "i_c"} and total > 150
    assert 0.72 < n["i_a"] / total < 0.88 and 0.08 < n["i_b"] / total < 0.22 and 0.01 < n["i_c"] / total < 0.10


def test_popularity_and_position_alone_do_not_separate_the_labels(spark):
    """On a log whose items keep their popularity, prior popularity and position carry ~no signal."""
    import numpy as np

    rng = np.random.default_rng(11)
    weights = rng.pareto(1.2, 300) + 0.1
    items = rng.choice(300, 3000, p=weights / weights.sum())
    log = clicks(spark, [(f"u{n % 400}", f"i{it}", int(n * 180 / 3000)) for n, it in enumerate(items)])
    requests = clicks_to_requests(log, ClickLogConfig(9, seed=7), "s").where(F.col("ts") >= T0 + timedelta(hours=1))
    leak = leak_statistics(requests, log)
    assert 0.40 <= leak["popularity_auc"] <= 0.65, leak
    assert 0.40 <= leak["recent_click_auc"] <= 0.65, leak
    assert 0.45 <= leak["position_auc"] <= 0.55, leak


def sparse_log(spark, hours=48, per_hour=8, items=20_000, seed=3):
    """A sparse click log: a long tail of items, a handful of clicks an hour, most items clicked once."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, items + 1) ** 0.6
    rows = []
    for h in range(hours):
        for _ in range(rng.poisson(per_hour)):
            rows.append((f"u{rng.integers(300)}", f"i{rng.choice(items, p=weights / weights.sum())}",
                         h * 60 + int(rng.integers(60))))
    return clicks(spark, rows)


def test_a_sparse_log_does_not_give_the_label_away(spark):
    """On a sparse log the clicked item rarely had a click in the hour before; a negative drawn from
    the clicks *before* the request (an earlier form of this generator) always had one (AUC 0.26 as
    of the request on such a log). Negatives drawn from the clicks after it keep every statistic near 0.5."""
    log = sparse_log(spark)
    leak = leak_statistics(clicks_to_requests(log, ClickLogConfig(), "s"), log)
    assert 0.40 <= leak["popularity_auc"] <= 0.65, leak
    assert 0.40 <= leak["recent_click_auc"] <= 0.65, leak
    assert 0.45 <= leak["position_auc"] <= 0.55, leak


def test_the_first_form_gives_the_label_away_on_a_sparse_log_and_the_check_says_so(spark):
    """``pool = "before"`` (negatives from the hour before each click) on the same sparse log: the
    statistics fall far outside the band, which is what makes training refuse such a source."""
    log = sparse_log(spark)
    leak = leak_statistics(clicks_to_requests(log, ClickLogConfig(pool="before"), "s"), log)
    assert leak["popularity_auc"] < 0.40 and leak["recent_click_auc"] < 0.40, leak


def test_negatives_are_never_the_users_own_clicks(spark):
    rows = [(f"u{n % 3}", f"i{n}", 1 + n) for n in range(30)]  # three users, ten items each, one hour
    known = [("z", f"i{n}", 0) for n in range(30)]  # every item clicked once before, so each can be a negative
    out = clicks_to_requests(clicks(spark, rows + known), ClickLogConfig(5, seed=2), "s").where("user_id != 'z'").collect()
    mine = {}
    for user, item, _ in rows:
        mine.setdefault(user, set()).add(item)
    negatives = [(r.user_id, r.item_id) for r in out if r.label == 0]
    assert len(negatives) > 60 and all(item not in mine[user] for user, item in negatives)


def test_new_items_are_as_common_among_negatives_as_among_clicks(spark):
    """Items first clicked after the request (a news article published after it) would otherwise
    fill the negatives of a dense news hour, and "no click yet" would give the label away; they take
    as many of the slots as first clicks take of the hour's clicks. ``match_new_items = false``
    draws from the pool as it is, and the known-item statistic sees the difference."""
    old = [(f"o{n}", f"old{n % 10}", n * 60 // 300) for n in range(300)]  # ten items clicked all hour
    new = [(f"n{n}", f"new{n % 20}", 20 + n * 40 // 200) for n in range(200)]  # twenty first clicked from minute 20
    log = clicks(spark, old + new)
    first = {}
    for u, i, m in old + new:
        first[i] = min(first.get(i, m), m)
    share_first = 30 / 500  # the hour's first clicks: ten old items and twenty new ones

    def new_share(requests):
        negatives = requests.where("label = 0").collect()
        assert len(negatives) > 1000
        return sum(T0 + timedelta(minutes=first[r.item_id]) >= r.ts for r in negatives) / len(negatives)

    matched = clicks_to_requests(log, ClickLogConfig(3, seed=4), "s")
    loose = clicks_to_requests(log, ClickLogConfig(3, seed=4, match_new_items=False), "s")
    assert abs(new_share(matched) - share_first) < 0.03
    assert new_share(loose) > 2 * share_first
    known = leak_statistics(matched, log)["known_item_auc"], leak_statistics(loose, log)["known_item_auc"]
    assert abs(known[0] - 0.5) < 0.05 < abs(known[1] - 0.5), known


def test_each_click_is_one_request_with_one_positive(spark, log):
    rows = clicks_to_requests(log, ClickLogConfig(2, pool_size=100, seed=1), "syn").collect()
    by_request = {}
    for r in rows:
        by_request.setdefault(r.request_id, []).append(r)
    assert len(by_request) == 9
    clicked_at = {(u, i): T0 + timedelta(minutes=m) for u, i, m in
                  [("a", "i1", 1), ("b", "i1", 2), ("c", "i1", 3), ("a", "i2", 4), ("b", "i2", 5), ("c", "i3", 6),
                   ("a", "i9", 61), ("b", "i1", 62), ("c", "i4", 63)]}
    for rid, cands in by_request.items():
        assert sum(c.label for c in cands) == 1
        positions = [c.position for c in cands]
        assert len(set(positions)) == len(cands) and set(positions) <= set(range(3))  # slots of a full list of K + 1
        assert len({c.item_id for c in cands}) == len(cands)
        clicked = rid.split(":")[-1]
        assert [c.item_id for c in cands if c.label == 1] == [clicked]
        user, ts = cands[0].user_id, cands[0].ts
        for c in cands:
            if c.label == 0:  # a click of another user after the request, of an item this user did not click
                assert any(t > ts and u != user for (u, i), t in clicked_at.items() if i == c.item_id), (rid, c.item_id)
                mine = clicked_at.get((user, c.item_id))
                assert mine is None or mine.hour not in (ts.hour, ts.hour + 1)  # not this user's click of the hours
    assert sum(len(c) - 1 for c in by_request.values()) >= 4


def test_same_seed_same_requests_other_seed_differs(spark):
    hour0 = [(f"u{n}", f"i{n % 20}", n % 60) for n in range(200)]
    hour1 = [(f"u{n}", f"i{n % 7}", 60 + n % 60) for n in range(50)]
    df = clicks(spark, hour0 + hour1)
    p = ClickLogConfig(5, pool_size=15, seed=3)
    cols = ["request_id", "item_id", "position", "label", "ts"]
    a = clicks_to_requests(df, p, "s").select(cols).orderBy(cols).collect()
    b = clicks_to_requests(df, p, "s").select(cols).orderBy(cols).collect()
    c = clicks_to_requests(df, ClickLogConfig(5, pool_size=15, seed=4), "s").select(cols).orderBy(cols).collect()
    assert a == b
    assert a != c
    # the clicked item's slot is spread over positions, so position does not give the label away
    slots = {r.position for r in a if r.label == 1 and r.ts >= T0 + timedelta(hours=1)}
    assert len(slots) >= 4


def test_a_log_split_into_overlapping_inputs_draws_what_the_whole_log_draws(spark, log):
    """Two files over the same hours (Globo's session files): the second, given the first's clicks,
    draws its requests' candidates from the same pools as the whole log."""
    p = ClickLogConfig(2, pool_size=6, seed=1)
    cols = ["request_id", "item_id", "position", "label"]
    whole = clicks_to_requests(log, p, "s").where(F.col("user_id") == "c").select(cols).orderBy(cols).collect()
    first, second = log.where(F.col("user_id") != "c"), log.where(F.col("user_id") == "c")
    split = clicks_to_requests(second, p, "s", prior_clicks=first).select(cols).orderBy(cols).collect()
    assert split == whole and any(r.label == 0 for r in split)


@pytest.mark.parametrize("kwargs", [dict(negatives_per_click=-1), dict(min_pool_clicks=0), dict(max_window_hours=0), dict(pool="around"),
                                    dict(negatives_per_click=10, pool_size=5)])
def test_bad_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ClickLogConfig(**kwargs)


def test_no_shuffle_carries_an_hours_pool(spark, log):
    """Every request row holds its hour's pool (``pool_size`` click events) while its negatives are
    drawn; a shuffle after the pools are joined would write that pool once per click (on the whole
    Globo log, ~150 GB of shuffle files, which filled the disk)."""
    rows = clicks_to_requests(log, ClickLogConfig(2, pool_size=100), "t")
    plan = rows._sc._jvm.org.apache.spark.sql.execution.ExplainMode.fromString("formatted")
    text = rows._jdf.queryExecution().explainString(plan)
    blocks = re.split(r"\n(?=\(\d+\) )", text)
    exchanges = [b for b in blocks if re.match(r"\(\d+\) (ShuffleExchange|Exchange)", b)]
    assert exchanges  # the check reads the plan's shuffles (the user's own clicks are joined through one)
    carrying = [b.splitlines()[0] for b in exchanges if re.search(r"Input \[\d+\]: \[[^\]]*\bpool\b", b)]
    assert carrying == []


def test_leak_statistics_count_each_window_as_a_range_over_the_items_clicks(spark):
    """The statistics by binary search per partition equal a direct count over every row's window
    (clicks of the item strictly before the row: in the hour, in the 24 hours, ever)."""
    import numpy as np

    rng = np.random.default_rng(3)
    minute = 60 * 10**6
    click_us = rng.integers(0, 48 * 60, 400) * minute
    click_items = rng.choice(["a", "b", "c", "d"], 400)
    req_us = rng.integers(0, 48 * 60, 600) * minute + rng.choice([0, 1], 600)  # some on a click's microsecond
    req_items = rng.choice(["a", "b", "c", "d", "e"], 600)
    labels = rng.integers(0, 2, 600)
    t0 = datetime(2026, 1, 5)
    as_ts = lambda us: [t0 + timedelta(microseconds=int(u)) for u in us]  # noqa: E731
    clicks = spark.createDataFrame(list(zip(click_items.tolist(), as_ts(click_us))), "item_id string, ts timestamp")
    requests = spark.createDataFrame([(i, t, int(lab), int(p)) for i, t, lab, p in
                                      zip(req_items.tolist(), as_ts(req_us), labels, rng.integers(0, 10, 600))] +
                                     [("a", t0, None, 0)],  # an unlabelled row counts in no histogram
                                     "item_id string, ts timestamp, label int, position int")
    got = leak_statistics(requests, clicks)

    def direct(lo):
        same = req_items[:, None] == click_items[None, :]
        inside = (click_us[None, :] < req_us[:, None]) & (click_us[None, :] >= req_us[:, None] - lo)
        return (same & inside).sum(axis=1)

    hour = 60 * minute
    for name, value in (("popularity_auc", direct(hour)), ("recent_click_auc", direct(24 * hour) > 0),
                        ("known_item_auc", direct(10**15) > 0)):
        assert got[name] == pytest.approx(histogram_auc(np.asarray(value, np.int64), labels)), name


def histogram_auc(values, labels) -> float:
    """The AUC of a statistic's values, counted directly from the rows (the tests' reference)."""
    import numpy as np

    from model.metrics import auc_from_histogram

    keys = np.unique(values)
    return auc_from_histogram(keys, [labels[values == k].sum() for k in keys], [(1 - labels[values == k]).sum() for k in keys])


def test_user_leak_statistics_count_each_users_clicks_strictly_before_the_request(spark):
    """The user-side statistics against a direct count: the category of the user's last click before
    the request, the share of the user's last ``recent`` clicks in the candidate's category (rows of
    an unknown category in neither histogram), and any click of the pair before."""
    import numpy as np
    import pandas as pd

    from spark_jobs.candidates import _user_histograms, user_leak_statistics

    rng = np.random.default_rng(11)
    minute = 60 * 10**6
    users, items = ["u1", "u2", "u3", "u4"], [f"i{n}" for n in range(12)]
    category = {i: f"c{n % 3}" for n, i in enumerate(items[:9])}  # i9..i11: no known category
    click_us = rng.choice(np.arange(0, 24 * 60), 160, replace=False) * minute  # one click per time
    click_users, click_items = rng.choice(users, 160), rng.choice(items, 160)
    req_us = rng.integers(0, 24 * 60, 500) * minute + rng.choice([0, 1], 500)  # some on a click's time
    req_users, req_items, labels = rng.choice(users, 500), rng.choice(items, 500), rng.integers(0, 2, 500)
    t0 = datetime(2026, 1, 5)
    as_ts = lambda us: [t0 + timedelta(microseconds=int(u)) for u in us]  # noqa: E731
    clicks = spark.createDataFrame(list(zip(click_users.tolist(), click_items.tolist(), as_ts(click_us))),
                                   "user_id string, item_id string, ts timestamp")
    requests = spark.createDataFrame([(u, i, t, int(lab)) for u, i, t, lab in
                                      zip(req_users.tolist(), req_items.tolist(), as_ts(req_us), labels)]
                                     + [("u1", "i1", t0, None)], "user_id string, item_id string, ts timestamp, label int")
    categories = spark.createDataFrame(sorted(category.items()), "item_id string, category string")
    got = user_leak_statistics(requests, clicks, categories, recent=3)

    same, share, seen, known = [], [], [], []
    for u, i, t in zip(req_users, req_items, req_us):
        mine = sorted((cu, ci) for cu, ci, cu_user in zip(click_us, click_items, click_users) if cu_user == u and cu < t)
        last3 = [category.get(ci) for _, ci in mine[-3:]]
        c = category.get(i)
        known.append(c is not None)
        same.append(int(c is not None and bool(mine) and category.get(mine[-1][1]) == c))
        share.append(round(1000 * last3.count(c) / len(last3)) if last3 and c is not None else 0)
        seen.append(int(any(ci == i for _, ci in mine)))
    known = np.array(known)
    assert got["same_category_auc"] == pytest.approx(histogram_auc(np.asarray(same)[known], labels[known]))
    assert got["category_share_auc"] == pytest.approx(histogram_auc(np.asarray(share)[known], labels[known]))
    assert got["interacted_before_auc"] == pytest.approx(histogram_auc(np.asarray(seen), labels))
    assert len(set(share)) > 3 and sum(seen) > 20 and sum(same) > 20  # the data exercises every statistic
    # a partition whose users have requests and no click at all: every row counts, as no click before
    alone = pd.DataFrame({"user_id": ["u9", "u9"], "item_id": ["i1", "i2"], "us": [5, 6], "label": [1, 0],
                          "category": ["c1", None]})
    hist = pd.concat(_user_histograms(iter([alone]), 3))
    assert sorted(map(tuple, hist.to_numpy().tolist())) == [("category_share", 0, 1, 0), ("interacted_before", 0, 1, 1),
                                                            ("same_category", 0, 1, 0)]
    nothing = user_leak_statistics(requests, clicks, None)
    assert nothing["same_category_auc"] is None and nothing["category_share_auc"] is None
    assert nothing["interacted_before_auc"] == pytest.approx(got["interacted_before_auc"])
