"""The tier-resolution rule on hand-built snapshots: order, expiry, neighbor weighting, bad rows."""

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from feature_store.resolution import EXACT, NEIGHBOR, NONE, TIERS, USER_MEAN, Snapshot, neighbor_weights

T = datetime(2026, 1, 5, 12)
TS = pa.timestamp("us", tz="UTC")


def pairs(rows):
    return pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows],
                     "embedding": pa.array([r[2] for r in rows], type=pa.list_(pa.float32())),
                     "computed_at": pa.array([r[3] for r in rows], type=TS),
                     "expires_at": pa.array([r[4] for r in rows], type=TS)})


def means(rows):
    return pa.table({"user_id": [r[0] for r in rows],
                     "embedding": pa.array([r[1] for r in rows], type=pa.list_(pa.float32())),
                     "computed_at": pa.array([r[2] for r in rows], type=TS),
                     "expires_at": pa.array([r[3] for r in rows], type=TS)})


def neighbors(rows):
    return pa.table({"user_id": [r[0] for r in rows], "rank": pa.array([r[1] for r in rows], type=pa.int32()),
                     "neighbor_id": [r[2] for r in rows], "similarity": pa.array([r[3] for r in rows], type=pa.float32()),
                     "computed_at": pa.array([T] * len(rows), type=TS),
                     "expires_at": pa.array([T + timedelta(hours=24)] * len(rows), type=TS)})


LIVE = (T, T + timedelta(hours=6))


@pytest.fixture
def snap():
    return Snapshot.from_arrow(
        pairs([("a", "i1", [1, 0], *LIVE), ("b", "i2", [0, 2], *LIVE), ("c", "i2", [0, 4], *LIVE),
               ("a", "old", [9, 9], T - timedelta(hours=7), T - timedelta(hours=1))]),  # expired
        means([("a", [0.5, 0.5], *LIVE), ("b", [1, 1], *LIVE), ("c", [3, 3], *LIVE)]),
        neighbors([("d", 1, "b", 0.9), ("d", 2, "c", 0.1), ("e", 1, "c", 0.5)]))


def test_first_matching_tier_wins(snap):
    emb, tier = snap.lookup("a", ["i1", "i2"], T + timedelta(hours=1))
    assert [TIERS[t] for t in tier] == ["exact", "user_mean"]
    np.testing.assert_array_equal(emb, [[1, 0], [0.5, 0.5]])


def test_neighbor_tier_prefers_neighbors_exact_embeddings_weighted_by_similarity(snap):
    emb, tier = snap.lookup("d", ["i2", "i1"], T + timedelta(hours=1))
    assert list(tier) == [NEIGHBOR, NEIGHBOR]
    np.testing.assert_allclose(emb[0], 0.9 * np.array([0, 2]) + 0.1 * np.array([0, 4]), rtol=1e-6)  # both have i2
    np.testing.assert_allclose(emb[1], 0.9 * np.array([1, 1]) + 0.1 * np.array([3, 3]), rtol=1e-6)  # neither: means


def test_expired_rows_are_never_served_and_unknown_ids_get_none(snap):
    emb, tier = snap.lookup("a", ["old"], T + timedelta(hours=1))
    assert list(tier) == [USER_MEAN]  # the exact row expired an hour before
    emb, tier = snap.lookup("a", ["i1"], T + timedelta(hours=6))  # expires_at itself is already expired
    assert list(tier) == [NONE] and not emb.any()
    emb, tier = snap.lookup("a", ["i1"], T - timedelta(seconds=1))  # before computed_at: not yet served
    assert list(tier) == [NONE]
    emb, tier = snap.lookup("stranger", ["i1", "nothing"], T + timedelta(hours=1))
    assert list(tier) == [NONE, NONE] and emb.shape == (2, 2) and not emb.any()


def test_per_row_times_match_one_lookup_per_time(snap):
    times = [T + timedelta(hours=h) for h in (1, 7)]
    emb, tier = snap.resolve(["a", "a"], ["i1", "i1"], times)
    assert list(tier) == [EXACT, NONE]


def test_empty_snapshot_and_empty_request():
    s = Snapshot.empty(dim=4)
    emb, tier = s.lookup("a", ["i1"], T)
    assert list(tier) == [NONE] and emb.shape == (1, 4)
    emb, tier = s.lookup("a", [], T)
    assert emb.shape == (0, 4) and tier.shape == (0,)


def test_nan_or_wrong_sized_rows_are_excluded_and_counted():
    s = Snapshot.from_arrow(pairs([("a", "i1", [1, 2], *LIVE), ("a", "i2", [float("nan"), 1], *LIVE),
                                   ("a", "i3", [1, 2, 3], *LIVE)]), means([("a", [1, float("inf")], *LIVE)]), None)
    assert s.dim == 2 and s.stats["excluded_invalid"] == 3 and s.stats["pairs"] == 1
    _, tier = s.lookup("a", ["i1", "i2", "i3"], T)
    assert list(tier) == [EXACT, NONE, NONE]


def test_weights_clip_negative_similarity_and_fall_back_to_uniform():
    w = neighbor_weights(np.array([[0.6, -0.2, 0.2], [-0.5, -0.1, 0.3]]), np.array([[1, 1, 1], [1, 1, 0]], bool))
    np.testing.assert_allclose(w, [[0.75, 0, 0.25], [0.5, 0.5, 0]])


def test_epoch_numbers_are_refused_as_times(snap):
    with pytest.raises(TypeError, match="expected times"):
        snap.lookup("a", ["i1"], 1767614400000000)


def item_means(rows):
    return pa.table({"item_id": [r[0] for r in rows],
                     "embedding": pa.array([r[1] for r in rows], type=pa.list_(pa.float32())),
                     "computed_at": pa.array([r[2] for r in rows], type=TS),
                     "expires_at": pa.array([r[3] for r in rows], type=TS)})


def test_item_mean_comes_after_exact_and_before_the_user_mean_and_expires():
    s = Snapshot.from_arrow(
        pairs([("a", "i1", [1, 0], *LIVE)]), means([("a", [0.5, 0.5], *LIVE)]), neighbors([("d", 1, "a", 0.9)]),
        item_means=item_means([("i1", [7, 7], *LIVE), ("i2", [2, 3], *LIVE),
                               ("gone", [4, 4], T - timedelta(hours=7), T - timedelta(hours=1)),
                               ("bad", [float("nan"), 1], *LIVE)]))
    now = T + timedelta(hours=1)
    emb, tier = s.lookup("a", ["i1", "i2", "gone", "bad", "new"], now)
    assert [TIERS[t] for t in tier] == ["exact", "item_mean", "user_mean", "user_mean", "user_mean"]
    np.testing.assert_array_equal(emb[:3], [[1, 0], [2, 3], [0.5, 0.5]])
    # a user with no row of any kind still gets the item's mean; nobody gets an expired or invalid one
    emb, tier = s.lookup("stranger", ["i2", "gone", "bad"], now)
    assert [TIERS[t] for t in tier] == ["item_mean", "none", "none"]
    assert s.stats["item_means"] == 3 and s.stats["excluded_invalid"] == 1
    # resolve (batch, one time per row) and lookup (online) agree
    emb_b, tier_b = s.resolve(["stranger"] * 3, ["i2", "gone", "bad"], [now] * 3)
    np.testing.assert_array_equal(emb_b, emb) and np.testing.assert_array_equal(tier_b, tier)


def test_tier_codes_are_stable_and_every_tier_is_tried():
    from model.tiers import ORDER

    assert TIERS[:4] == ("exact", "user_mean", "neighbor", "none")  # the codes clients already decode
    assert sorted(ORDER) == sorted(TIERS) and ORDER[0] == "exact" and ORDER[-1] == "none"


def test_a_snapshot_of_one_code_space_reads_only_its_rows(tmp_path):
    """A publication names its code space: codes of another FM or autoencoder (or written before
    code spaces were recorded) are never read into it, in any tier; one without a code space (an
    older publication) reads every row, as before."""
    from deltalake import write_deltalake

    from feature_store.resolution import ITEM_MEAN

    a, b = "fm/v0002@aaaa+autoencoder/v0002@aaaa", "fm/v0001@bbbb+autoencoder/v0001@bbbb"
    write_deltalake(str(tmp_path / "pair_embeddings"), pairs([("u", "i1", [1, 0], *LIVE), ("u", "i2", [0, 2], *LIVE)])
                    .append_column("model_version", pa.array([a, b])))
    write_deltalake(str(tmp_path / "user_mean_embeddings"), means([("u", [3, 3], *LIVE), ("v", [4, 4], *LIVE)])
                    .append_column("code_version", pa.array([b, a])))
    # written before the table had code_version: its rows are of no known code space
    write_deltalake(str(tmp_path / "item_mean_embeddings"), means([("i3", [5, 5], *LIVE)]).rename_columns(
        ["item_id", "embedding", "computed_at", "expires_at"]))
    versions = {"pair_embeddings_version": 0, "user_mean_embeddings_version": 0, "item_mean_embeddings_version": 0}

    snap = Snapshot.load(tmp_path, versions | {"code_version": a}, dim=2)
    assert snap.code_version == a
    emb, tier = snap.resolve(["u", "u", "v", "u"], ["i1", "i2", "i9", "i3"], T)
    # u's i2 and u's mean are of the other code space, i3's item mean of none: zeros, not their codes
    assert tier.tolist() == [EXACT, NONE, USER_MEAN, NONE]
    np.testing.assert_array_equal(emb, [[1, 0], [0, 0], [4, 4], [0, 0]])

    every = Snapshot.load(tmp_path, versions, dim=2)
    assert every.code_version is None
    assert every.resolve(["u", "u"], ["i2", "i3"], T)[1].tolist() == [EXACT, ITEM_MEAN]
