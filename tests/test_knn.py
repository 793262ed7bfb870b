"""The incremental neighbour search (model/knn.update_neighbors) against a search from scratch:
over several builds in which users move, leave and arrive and lenders join and leave, every user's
top k is the exact top k of the lenders of that build."""

import numpy as np
import pytest

from include.config import FallbackConfig
from model.knn import Candidates, normalize, top_k, update_neighbors

CFG = FallbackConfig(neighbors_k=4, recall_sample=200)
DEPTH = 8


def from_scratch(unit, is_lender, key):
    n = len(unit)
    none = Candidates(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(n, bool))
    return update_neighbors(unit, is_lender, np.ones(n, bool), np.zeros(n, bool), none, key, CFG, DEPTH)


def exact_top_k(unit, is_lender, k):
    sims = unit @ unit[is_lender].T
    lenders = np.flatnonzero(is_lender)
    sims[lenders, np.arange(len(lenders))] = -np.inf  # never oneself
    out = []
    for q in range(len(unit)):
        order = np.argsort(-sims[q], kind="stable")[: min(k, len(lenders) - is_lender[q])]
        out.append(set(lenders[order].tolist()))
    return out


def remap(prev: Candidates, prev_ids, ids, prev_lender, prev_vectors, vectors):
    """The previous build's lists and flags in this build's rows, as the job reads them from its state."""
    pos = {u: i for i, u in enumerate(ids)}
    old_to_new = np.array([pos.get(u, -1) for u in prev_ids], np.int64)
    at = old_to_new[prev.user]
    here = at >= 0
    n = len(ids)
    previous = Candidates(at[here], old_to_new[prev.lender[here]], prev.similarity[here], np.zeros(n, bool))
    order = np.lexsort((np.zeros(here.sum()), previous.user))  # keep rank order within each user
    previous = Candidates(previous.user[order], previous.lender[order], previous.similarity[order], previous.complete)
    was_lender, fresh = np.zeros(n, bool), np.ones(n, bool)
    for old, new in enumerate(old_to_new):
        if new >= 0:
            previous.complete[new] = prev.complete[old]
            was_lender[new] = prev_lender[old]
            fresh[new] = not np.array_equal(prev_vectors[old], vectors[new])
    return previous, was_lender, fresh


@pytest.mark.parametrize("seed", range(6))
def test_an_incremental_build_equals_a_build_from_scratch(seed):
    rng = np.random.default_rng(seed)
    ids = np.array([f"u{i}" for i in range(300)], dtype=object)
    vectors = rng.normal(size=(300, 6)).astype(np.float32)
    is_lender = rng.random(300) < 0.3
    unit, _ = normalize(vectors)
    built, _ = from_scratch(unit, is_lender, np.arange(300))
    for _ in range(4):  # four later builds, each changing a little of everything
        n = len(ids)
        stay = rng.random(n) > 0.05
        new_ids = np.concatenate([ids[stay], np.array([f"n{seed}_{_}_{i}" for i in range(15)], dtype=object)])
        new_vectors = np.concatenate([vectors[stay], rng.normal(size=(15, 6)).astype(np.float32)])
        moved = rng.random(len(new_ids)) < 0.1
        new_vectors[moved] += rng.normal(scale=0.5, size=(moved.sum(), 6)).astype(np.float32)
        new_lender = np.concatenate([is_lender[stay], rng.random(15) < 0.3])
        flip = rng.random(len(new_ids)) < 0.05
        new_lender[flip] = ~new_lender[flip]
        previous, was_lender, fresh = remap(built, ids, new_ids, is_lender, vectors, new_vectors)
        key = np.argsort(np.argsort(new_ids))
        new_unit, _ = normalize(new_vectors)
        got, stats = update_neighbors(new_unit, new_lender, fresh, was_lender, previous, key, CFG, DEPTH)
        assert stats["searched_joined_only"] > stats["searched_whole_index"]  # the point: most users are not re-searched
        want = exact_top_k(new_unit, new_lender, CFG.neighbors_k)
        top = top_k(got, len(new_ids), CFG.neighbors_k)
        assert [set(t[t >= 0].tolist()) for t in top] == want
        assert stats["recall_at_k"] == 1.0
        scratch, _ = from_scratch(new_unit, new_lender, key)
        np.testing.assert_array_equal(top_k(scratch, len(new_ids), CFG.neighbors_k), top)
        ids, vectors, is_lender, built = new_ids, new_vectors, new_lender, got


def test_a_build_with_nothing_changed_keeps_every_list_and_searches_nobody():
    rng = np.random.default_rng(7)
    unit, _ = normalize(rng.normal(size=(50, 4)).astype(np.float32))
    lender = rng.random(50) < 0.5
    built, _ = from_scratch(unit, lender, np.arange(50))
    again, stats = update_neighbors(unit, lender, np.zeros(50, bool), lender, built, np.arange(50), CFG, DEPTH)
    assert (stats["searched_whole_index"], stats["joined_lenders"]) == (0, 0)
    for a, b in zip((built.user, built.lender, built.similarity, built.complete),
                    (again.user, again.lender, again.similarity, again.complete)):
        np.testing.assert_array_equal(a, b)


def test_few_lenders_give_complete_lists_and_no_lenders_give_none():
    unit, _ = normalize(np.eye(5, dtype=np.float32))
    lender = np.array([True, True, False, False, False])
    got, _ = from_scratch(unit, lender, np.arange(5))
    assert got.complete.all()  # two lenders: every list holds all of them
    top = top_k(got, 5, CFG.neighbors_k)
    assert set(top[0][top[0] >= 0]) == {1} and set(top[2][top[2] >= 0]) == {0, 1}
    got, stats = from_scratch(unit, np.zeros(5, bool), np.arange(5))
    assert len(got.user) == 0 and stats["indexed"] == 0
