"""The synthetic impression world: deterministic, its labels drawn from the truth it writes, its
structure (new items, returning users, conversions after clicks) present, and no single feature
that gives the label away."""

import numpy as np
import pandas as pd
import pytest

from include import synthetic_world as sw
from model import metrics

SMALL = sw.WorldConfig(users=300, items=120, hours=12, visits_per_hour=60)


@pytest.fixture(scope="module")
def world():
    return sw.generate(SMALL)


def test_the_same_seed_gives_the_same_world_and_another_seed_another(world):
    again = sw.generate(SMALL)
    for part in ("impressions", "items", "truth"):
        for k, v in world[part].items():
            np.testing.assert_array_equal(v, again[part][k], err_msg=f"{part}.{k}")
    other = sw.generate(sw.WorldConfig(**{**SMALL.__dict__, "seed": 8}))
    assert not np.array_equal(other["truth"]["p_click"][:100], world["truth"]["p_click"][:100])


def test_labels_are_drawn_from_the_truth(world):
    im, tr = world["impressions"], world["truth"]
    assert (tr["request_id"] == im["request_id"]).all() and (tr["item_id"] == im["item_id"]).all()
    p, y = tr["p_click"], im["label"]
    assert ((p > 0) & (p < 1)).all()
    # calibrated by construction: the click rate in each tenth of p matches its mean p
    bins = np.quantile(p, np.linspace(0, 1, 11))
    which = np.clip(np.searchsorted(bins, p, side="right") - 1, 0, 9)
    for b in range(10):
        sel = which == b
        se = np.sqrt(p[sel].mean() * (1 - p[sel].mean()) / sel.sum())
        assert abs(y[sel].mean() - p[sel].mean()) < 4 * se + 1e-3, b
    # the truth ranks far better than chance, and is the NE floor on its own labels
    assert metrics.auc(y, p) > 0.7
    assert metrics.normalized_entropy(y, p) < metrics.normalized_entropy(y, np.full(len(y), y.mean()))


def test_conversions_follow_clicks_and_their_truth_is_below_the_clicks(world):
    im, tr = world["impressions"], world["truth"]
    assert not (im["conversion"].astype(bool) & ~im["label"].astype(bool)).any()
    assert (tr["p_conversion"] <= tr["p_click"]).all() and 0 < im["conversion"].sum() < im["label"].sum()


def test_requests_show_k_distinct_items_in_slots_and_users_return(world):
    df = pd.DataFrame(world["impressions"])
    per = df.groupby("request_id").agg(n=("item_id", "size"), distinct=("item_id", "nunique"),
                                       slots=("position", lambda s: sorted(s)), user=("user_id", "nunique"),
                                       ts=("ts", "nunique"))
    assert (per["n"] == SMALL.shown).all() and (per["distinct"] == SMALL.shown).all()
    assert (per["user"] == 1).all() and (per["ts"] == 1).all()
    assert per["slots"].map(lambda s: s == list(range(SMALL.shown))).all()
    hours = df.assign(h=df["ts"] // 3_600_000).groupby("user_id")["h"].nunique()
    assert (hours > 1).mean() > 0.3  # many users come back in a later hour
    late = set(df[df["ts"] >= df["ts"].min() + 9 * 3_600_000]["item_id"])
    early = set(df[df["ts"] < df["ts"].min() + 6 * 3_600_000]["item_id"])
    assert late - early  # items born after the first hours are shown later


def test_no_single_logged_feature_separates_the_labels(world):
    """Prior popularity (the item's clicks in the hour before) and the slot are informative, as in
    real logs, but neither alone gives the label away."""
    df = pd.DataFrame(world["impressions"])
    df["hour"] = df["ts"] // 3_600_000
    clicks = df[df["label"] == 1].groupby(["hour", "item_id"]).size().rename("prior").reset_index()
    clicks["hour"] += 1
    df = df.merge(clicks, on=["hour", "item_id"], how="left").fillna({"prior": 0})
    y = df["label"].to_numpy()
    for score in (df["prior"].to_numpy(), 1.0 / (2 + df["position"].to_numpy())):
        auc = metrics.auc(y, score / (score.max() + 1))
        assert 0.4 <= auc <= 0.75, auc


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="cannot show 10 items per request out of 5"):
        sw.WorldConfig(items=5)
    with pytest.raises(ValueError, match="must all be >= 1"):
        sw.WorldConfig(users=0)


def test_write_gives_the_three_files(world, tmp_path):
    paths = sw.write(world, tmp_path / "w")
    im = pd.read_csv(paths["impressions"])
    assert list(im.columns) == ["request_id", "user_id", "item_id", "ts", "position", "label", "conversion",
                                "surface", "device", "region", "referrer"]
    assert len(im) == len(world["impressions"]["ts"])
    assert list(pd.read_csv(paths["items"]).columns) == ["item_id", "category", "subcategory"]
    tr = pd.read_csv(paths["truth"])
    np.testing.assert_allclose(tr["p_click"], world["truth"]["p_click"], rtol=1e-5)
