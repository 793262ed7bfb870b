"""Point-in-time history, vocabularies and OOV handling."""

import numpy as np
import pandas as pd
import pytest

from model.features import (COUNTERS, OOV, PAD, Vocab, build_examples, history_matrix, last_click_inputs,
                            position_code, recency_code, subset)

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


def test_the_last_click_is_the_users_last_event_strictly_before_the_request():
    ev = pd.DataFrame({"user_id": ["a", "a", "b"], "item_id": ["p", "q", "r"],
                       "ts": [T + pd.Timedelta(minutes=m) for m in (1, 5, 2)]})
    req = pd.DataFrame({"user_id": ["a", "a", "b", "c"], "item_id": ["q", "r", "p", "p"], "label": [1, 0, 0, 1],
                        "ts": [T + pd.Timedelta(minutes=m) for m in (5, 30, 0, 9)], "device": ["d"] * 4,
                        "surface": ["s"] * 4})
    vocab = Vocab.fit(req, ev)
    got = last_click_inputs(build_examples(req, ev, vocab, 1))
    # the click at exactly the request's time is not before it; b's only click comes after; c has none
    assert got["last_item"].tolist() == [*vocab.encode("item", ["p", "q"]).tolist(), PAD, PAD]
    assert got["last_age"].tolist() == [*recency_code(np.array([4, 25]) * 60_000_000).tolist(), 0, 0]


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
    assert x["hist"].tolist() == [[PAD] * 4] and (x["hist"] != PAD).sum(axis=1).tolist() == [0]
    assert x["hist_age"].tolist() == [[PAD] * 4] and x["hist_cat"].tolist() == [[PAD] * 4]


def _frames():
    ev = pd.DataFrame({"user_id": ["a", "a", "b", "a", "b", "c"], "item_id": ["p", "q", "p", "p", "r", "p"],
                       "ts": [T - pd.Timedelta(hours=30), T - pd.Timedelta(hours=5), T - pd.Timedelta(minutes=30),
                              T - pd.Timedelta(minutes=2), T - pd.Timedelta(minutes=1), T],
                       "event_type": ["click", "click", "click", "history", "click", "click"]})
    items = pd.DataFrame({"item_id": ["p", "q", "r"], "category": ["news", "sport", "news"],
                          "subcategory": ["n1", "s1", None]})
    req = pd.DataFrame({"request_id": ["r1", "r1", "r2"], "user_id": ["a", "a", "b"], "item_id": ["p", "r", "q"],
                        "ts": [T, T, T], "label": [1, 0, 0], "device": ["d"] * 3, "surface": ["s"] * 3,
                        "position": [0, 1, None]})
    return req, ev, items


def test_counters_count_only_the_past_within_their_windows():
    """Item clicks in [t-1h, t) and [t-24h, t) from click events only; age from the first click in
    the horizon; the user's events in the horizon, per candidate category and in all."""
    req, ev, items = _frames()
    x = build_examples(req, ev, Vocab.fit(req, ev, items), 5, items, horizon_hours=24)
    c = dict(zip(COUNTERS, x["counters"].T))
    # p: clicked by b 30 min before (a's event 2 min before is history, c's at t is not before t)
    assert np.expm1(c["item_clicks_1h"]).round().tolist() == [1, 1, 0]
    assert np.expm1(c["item_clicks_24h"]).round().tolist() == [1, 1, 1]  # q clicked 5 h before; the 30 h click is out
    assert c["item_seen"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(np.expm1(c["item_age_hours"]), [0.5, 1 / 60, 5], rtol=1e-5)
    # a has 2 events in the 24 h horizon (q sport, p news); b has 2 (p news, r news)
    assert np.expm1(c["user_clicks"]).round().tolist() == [2, 2, 2]
    assert np.expm1(c["user_category_clicks"]).round().tolist() == [1, 1, 0]  # news, news; b never read sport
    np.testing.assert_allclose(c["user_category_share"], [0.5, 0.5, 0.0])
    assert x["counters"].dtype == np.float32


def test_history_is_one_row_per_request_with_categories_and_recency():
    req, ev, items = _frames()
    vocab = Vocab.fit(req, ev, items)
    x = build_examples(req, ev, vocab, 3, items)
    assert x["req"].tolist() == [0, 0, 1] and x["hist"].shape == (2, 3)
    assert x["hist"].tolist() == [vocab.encode("item", ["p", "q", "p"]).tolist(),
                                  [PAD] + vocab.encode("item", ["p", "r"]).tolist()]
    assert x["hist_cat"][1].tolist() == [PAD] + vocab.encode("category", ["news", "news"]).tolist()
    assert x["hist_age"][1].tolist() == [PAD, recency_code(30 * 60_000_000), recency_code(60_000_000)]
    assert x["category"].tolist() == vocab.encode("category", ["news", "news", "sport"]).tolist()
    assert x["subcategory"].tolist() == vocab.encode("subcategory", ["n1", None, "s1"]).tolist()
    assert x["position"].tolist() == [1, 2, 0]  # slot + 1; unknown slot 0


def test_recency_and_position_codes():
    assert recency_code(np.array([0, 60_000_000, 3 * 60_000_000, 10**15])).tolist() == [1, 2, 3, 15]
    assert position_code([0, 3, None, 100]).tolist() == [1, 4, 0, 16]


def test_subset_keeps_only_the_requests_of_its_rows():
    req, ev, items = _frames()
    x = build_examples(req, ev, Vocab.fit(req, ev, items), 3, items)
    part = subset(x, np.array([2]))
    assert part["req"].tolist() == [0] and part["hist"].tolist() == x["hist"][1:].tolist()
    assert part["item"].tolist() == x["item"][2:].tolist()


def test_batches_by_request_and_inference_returns_rows_in_input_order():
    """A grouped batch carries whole requests; infer() puts each prediction back at its row."""
    import torch

    from model.train import batches, infer

    rng = np.random.default_rng(3)
    req = rng.permutation(np.repeat(np.arange(50), 4))  # rows of a request are not contiguous
    x = {"req": req, "hist": np.arange(50)[:, None].repeat(2, 1), "label": np.zeros(200, np.float32),
         "row": np.arange(200)}
    seen = []
    for rows, b in batches(x, 30, torch.device("cpu"), shuffle=True, seed=1):
        assert (b["hist"][b["req"], 0].numpy() == req[rows]).all()  # each row sees its own request's history
        assert (b["row"].numpy() == rows).all()
        seen.append(rows)
    assert sorted(np.concatenate(seen).tolist()) == list(range(200))
    out = infer(lambda b: b["hist"][b["req"], 0].float() * 1000 + b["row"].float(), torch.nn.Identity(), x, 30)
    assert out.tolist() == (req * 1000 + np.arange(200)).astype(np.float32).tolist()
