"""Metric functions against values computed by hand."""

import math

import numpy as np
import pytest

from model import metrics


def test_log_loss_and_ne_by_hand():
    y, p = [1, 0, 0, 0], [0.8, 0.1, 0.2, 0.4]
    ll = -(math.log(0.8) + math.log(0.9) + math.log(0.8) + math.log(0.6)) / 4
    assert metrics.log_loss(y, p) == pytest.approx(ll, abs=1e-12)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # entropy of the set's own CTR, 1/4
    assert metrics.background_entropy(y) == pytest.approx(h, abs=1e-12)
    assert metrics.normalized_entropy(y, p) == pytest.approx(ll / h, abs=1e-12)
    assert metrics.normalized_entropy(y, [0.25] * 4) == pytest.approx(1.0, abs=1e-12)  # predicting the CTR: NE 1


def test_auc_by_hand_with_ties():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5), (0.9>0.1), (0.5=0.5 -> 1/2), (0.5>0.1) = 3.5 / 4
    assert metrics.auc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(0.875)
    assert metrics.auc([1, 0], [0.2, 0.8]) == 0.0
    assert metrics.auc([1, 0, 1], [0.7, 0.1, 0.9]) == 1.0
    assert math.isnan(metrics.auc([1, 1], [0.3, 0.4]))


def test_auc_matches_pairwise_count_on_random_data():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    p = np.round(rng.random(300), 2)  # many ties
    pos, neg = p[y == 1], p[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert metrics.auc(y, p) == pytest.approx(pairwise, abs=1e-12)


def test_calibration_and_transfer_ratio():
    assert metrics.calibration([1, 0, 0, 0], [0.5, 0.25, 0.25, 0.0]) == pytest.approx(1.0)
    assert metrics.calibration([1, 0], [1.0, 0.0]) == pytest.approx(1.0)
    assert metrics.calibration([1, 0, 0, 0], [0.5] * 4) == pytest.approx(2.0)
    assert metrics.transfer_ratio(0.90, 0.87, 0.80) == pytest.approx(0.3)
    assert metrics.transfer_ratio(0.90, 0.80, 0.80) == pytest.approx(1.0)
    assert math.isnan(metrics.transfer_ratio(0.80, 0.85, 0.90))  # FM not better: nothing to transfer


@pytest.mark.parametrize("y, p, message", [([1, 0], [0.5], "differ in length"), ([], [], "no examples"),
                                           ([1, 0], [0.5, float("nan")], "NaN or infinite"),
                                           ([1, 2], [0.5, 0.5], "labels must be 0 or 1")])
def test_bad_inputs_are_rejected(y, p, message):
    with pytest.raises(ValueError, match=message):
        metrics.log_loss(y, p)


def test_extreme_predictions_are_clipped_not_infinite():
    assert math.isfinite(metrics.log_loss([1, 0], [0.0, 1.0]))


def _three_models(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    signal = np.where(y == 1, 0.3, -0.3)
    vm = 1 / (1 + np.exp(-(0.5 * signal + rng.normal(0, 1, n))))
    fm = 1 / (1 + np.exp(-(3.0 * signal + rng.normal(0, 1, n))))  # far better than the VM
    half = (vm + fm) / 2
    groups = np.repeat(np.arange(n // 6), 6)  # six candidates a request
    return y, {"VM": vm, "FM": fm, "half": half}, groups


def test_bootstrap_intervals_contain_their_point_estimates_and_repeat_given_the_seed():
    y, preds, groups = _three_models()
    out = metrics.paired_bootstrap(y, preds, groups, "VM", "FM", resamples=300, seed=3)
    again = metrics.paired_bootstrap(y, preds, groups, "VM", "FM", resamples=300, seed=3)
    other = metrics.paired_bootstrap(y, preds, groups, "VM", "FM", resamples=300, seed=4)
    assert out == again and out != other
    for name, p in preds.items():
        lo, hi = out[name]["ne"]
        assert lo <= metrics.normalized_entropy(y, p) <= hi
        lo, hi = out[name]["auc"]
        assert lo <= metrics.auc(y, p) <= hi
        lo, hi = out[name]["ne_delta_pct_ci"]
        assert lo <= out[name]["ne_delta_pct"] <= hi
    assert out["VM"]["ne_delta_pct_ci"] == (0.0, 0.0) and out["VM"]["auc_delta_ci"] == (0.0, 0.0)  # paired
    assert out["_meta"] == {"resamples": 300, "level": 0.95, "groups": 1000, "seeds": 1, "reference_beats_baseline": True}
    ratio = metrics.transfer_ratio(*(metrics.normalized_entropy(y, preds[n]) for n in ("VM", "half", "FM")))
    lo, hi = out["half"]["transfer_ratio_ci"]
    assert 0 < lo <= ratio <= hi < 1 and out["FM"]["transfer_ratio_ci"] == (1.0, 1.0)
    assert metrics.transfer_label(ratio, (lo, hi), True) == f"{100 * ratio:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"


def test_a_reference_that_is_not_better_gets_no_transfer_ratio():
    y, preds, groups = _three_models()
    out = metrics.paired_bootstrap(y, preds, groups, "FM", "VM", resamples=200)  # roles swapped: VM is worse
    assert out["_meta"]["reference_beats_baseline"] is False
    assert out["VM"]["ne_delta_pct_ci"][0] > 0
    assert metrics.transfer_label(0.4, (0.1, 0.7), out["_meta"]["reference_beats_baseline"]) == "n/a: FM not better"
    # the same model twice: a delta of exactly zero, whose interval does not exclude zero
    same = metrics.paired_bootstrap(y, {"VM": preds["VM"], "FM": preds["VM"].copy()}, groups, "VM", "FM", resamples=50)
    assert same["_meta"]["reference_beats_baseline"] is False


def test_weighted_resamples_equal_duplicated_rows():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 500).astype(float)
    p = np.round(rng.random(500), 1)  # ties
    w = rng.integers(0, 3, 500).astype(float)
    rows = np.repeat(np.arange(500), w.astype(int))
    assert metrics._weighted_auc(y, p, w[None])[0] == pytest.approx(metrics.auc(y[rows], p[rows]), abs=1e-12)
    ll = -(y * np.log(np.clip(p, metrics.EPS, 1 - metrics.EPS)) + (1 - y) * np.log(1 - np.clip(p, metrics.EPS, 1 - metrics.EPS)))
    assert metrics._weighted_ne(y, ll, w[None])[0] == pytest.approx(metrics.normalized_entropy(y[rows], p[rows]), rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [(dict(resamples=0), "resamples"), (dict(level=1.0), "level"),
                                             (dict(baseline="nope"), "must be among")])
def test_bootstrap_rejects_bad_arguments(kwargs, message):
    y, preds, groups = _three_models(60)
    args = {"baseline": "VM", "reference": "FM", **kwargs}
    with pytest.raises(ValueError, match=message):
        metrics.paired_bootstrap(y, preds, groups, **args)
    with pytest.raises(ValueError, match="groups and labels differ"):
        metrics.paired_bootstrap(y, preds, groups[:-1], "VM", "FM")


def test_auc_from_a_histogram_equals_auc_on_its_rows():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 400)
    score = rng.integers(0, 12, 400).astype(float)  # few distinct values: many ties
    values = np.unique(score)
    pos = [int(((score == v) & (y == 1)).sum()) for v in values]
    neg = [int(((score == v) & (y == 0)).sum()) for v in values]
    # auc() takes probabilities (it clips to [0, 1]): the same ranking scaled into it
    assert metrics.auc_from_histogram(values[::-1], pos[::-1], neg[::-1]) == pytest.approx(metrics.auc(y, score / 12), abs=1e-12)
    # one positive at 1 against negatives at 1 (a tie: half) and 2 (below it): (0.5 + 0) / 2
    assert metrics.auc_from_histogram([1, 1, 2], [1, 0, 0], [0, 1, 1]) == pytest.approx(0.25)  # equal values merged
    assert math.isnan(metrics.auc_from_histogram([1, 2], [0, 0], [3, 4]))


def test_bootstrap_over_seeds_is_centred_on_the_mean_over_seeds():
    y, preds, groups = _three_models()
    rng = np.random.default_rng(5)
    # three "seeds" of the SOLARIS model: the same model with its own noise each
    seeded = np.clip(preds["half"][None, :] + rng.normal(0, 0.04, (3, len(y))), 0.01, 0.99)
    one = metrics.paired_bootstrap(y, {**preds, "SOLARIS": seeded[0]}, groups, "VM", "FM", resamples=300, seed=3)
    three = metrics.paired_bootstrap(y, {**preds, "SOLARIS": seeded}, groups, "VM", "FM", resamples=300, seed=3)
    assert three["_meta"]["seeds"] == 3 and one["_meta"]["seeds"] == 1
    mean_ne = np.mean([metrics.normalized_entropy(y, row) for row in seeded])
    assert three["SOLARIS"]["ne_delta_pct"] == pytest.approx(
        100 * (mean_ne - metrics.normalized_entropy(y, preds["VM"])) / metrics.normalized_entropy(y, preds["VM"]))
    lo, hi = three["SOLARIS"]["ne"]
    assert lo <= mean_ne <= hi
    # a model of one seed (the FM) is the same in both; a summary of seeds is their mean
    assert three["FM"]["ne"] == one["FM"]["ne"]
    assert metrics.summary(y, seeded)["ne"] == pytest.approx(mean_ne) and metrics.summary(y, seeded)["seeds"] == 3
    with pytest.raises(ValueError, match="one per seed"):
        metrics.paired_bootstrap(y, {"VM": seeded[:2], "SOLARIS": seeded}, groups, "VM")
