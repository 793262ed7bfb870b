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
