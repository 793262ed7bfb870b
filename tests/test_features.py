"""Point-in-time history, vocabularies and OOV handling."""

import numpy as np
import pandas as pd
import pytest

from model.features import OOV, PAD, Vocab, build_examples, history_matrix

T = pd.Timestamp("2026-01-05 10:00:00")


def ts(minutes):
    return (T + pd.Timedelta(minutes=minutes)).to_datetime64().astype("datetime64[us]").astype(np.int64)


def test_history_is_strictly_before_and_oldest_first():
    ev_users = np.array(["a", "a", "a", "b", "a"])
    ev_times = np.array([ts(1), ts(2), ts(3), ts(1), ts(5)])
    ev_items = np.array([11, 12, 13, 21, 15])
    users = np.array(["a", "a", "b", "c"])
    times = np.array([ts(3), ts(10), ts(0), ts(9)])
    hist, n = history_matrix(users, times, ev_users, ev_times, ev_items, length=3)
    assert hist.tolist() == [[PAD, 11, 12],  # the event at exactly t is not history
                             [12, 13, 15],  # the last three before t
                             [PAD, PAD, PAD],  # b's only event is after t
                             [PAD, PAD, PAD]]  # c has no events
    assert n.tolist() == [2, 3, 0, 0]


def test_no_feature_depends_on_a_later_event():
    rng = np.random.default_rng(1)
    ev = pd.DataFrame({"user_id": rng.choice(["a", "b", "c"], 200), "item_id": rng.choice(list("pqrstuvw"), 200),
                       "ts": T + pd.to_timedelta(rng.integers(0, 600, 200), unit="min")})
    req = pd.DataFrame({"user_id": ["a", "b", "c"], "item_id": ["p", "q", "r"], "ts": [T + pd.Timedelta(minutes=300)] * 3,
                        "label": [1, 0, 1], "device": ["d"] * 3, "surface": ["s"] * 3})
    vocab = Vocab.fit(req, ev)
    full = build_examples(req, ev, vocab, 20)
    past_only = build_examples(req, ev[ev["ts"] < req["ts"][0]], vocab, 20)
    np.testing.assert_array_equal(full["hist"], past_only["hist"])


def test_vocab_codes_unknown_ids_as_oov_and_missing_as_padding():
    v = Vocab({"item": ["x", "y"], "user": [], "device": [], "surface": [], "category": []})
    assert v.encode("item", ["x", "y", "new", None]).tolist() == [2, 3, OOV, PAD]
    assert v.size("item") == 4


def test_examples_from_empty_window_or_unknown_labels_are_errors():
    ev = pd.DataFrame({"user_id": ["a"], "item_id": ["p"], "ts": [T]})
    req = pd.DataFrame({"user_id": ["a"], "item_id": ["p"], "ts": [T], "label": [None], "device": ["d"], "surface": ["s"]})
    vocab = Vocab.fit(req, ev)
    with pytest.raises(ValueError, match="unknown \\(NULL\\) labels"):
        build_examples(req, ev, vocab, 5)
    with pytest.raises(ValueError, match="empty window"):
        build_examples(req.iloc[:0], ev, vocab, 5)


def test_user_without_history_gets_an_all_padding_row():
    ev = pd.DataFrame({"user_id": ["a"], "item_id": ["p"], "ts": [T]})
    req = pd.DataFrame({"user_id": ["new"], "item_id": ["p"], "ts": [T + pd.Timedelta(hours=1)], "label": [1],
                        "device": ["d"], "surface": ["s"]})
    x = build_examples(req, ev, Vocab.fit(req, ev), 4)
    assert x["hist"].tolist() == [[PAD] * 4] and x["hist_len"].tolist() == [0]
