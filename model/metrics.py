"""Ranking metrics: log loss, normalized entropy, AUC, calibration, transfer ratio.

NE follows He et al. (2014): the average log loss divided by the entropy of the *evaluated set's
own* click rate p, -(p log p + (1-p) log(1-p)). NE < 1 means the model beats always predicting p.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-7


def _check(labels, probs) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"labels and predictions differ in length: {y.shape[0]} vs {p.shape[0]}")
    if y.size == 0:
        raise ValueError("no examples to evaluate")
    if not np.isfinite(p).all():
        raise ValueError(f"{int((~np.isfinite(p)).sum())} predictions are NaN or infinite")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    return y, np.clip(p, EPS, 1 - EPS)


def log_loss(labels, probs) -> float:
    y, p = _check(labels, probs)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def background_entropy(labels) -> float:
    ctr = float(np.clip(np.mean(np.asarray(labels, dtype=np.float64)), EPS, 1 - EPS))
    return -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))


def normalized_entropy(labels, probs) -> float:
    return log_loss(labels, probs) / background_entropy(labels)


def auc(labels, probs) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); NaN with one class."""
    y, p = _check(labels, probs)
    n_pos = y.sum()
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sorted_p = p[order]
    ranks = np.empty(y.size)
    # average rank within each run of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_p)) + 1]
    ends = np.r_[starts[1:], y.size]
    avg = (starts + ends + 1) / 2.0  # 1-based ranks
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def calibration(labels, probs) -> float:
    """Mean prediction / observed click rate: 1.0 is calibrated, >1 over-predicts."""
    y, p = _check(labels, probs)
    rate = y.mean()
    return float(p.mean() / rate) if rate > 0 else float("inf")


def transfer_ratio(ne_vm: float, ne_variant: float, ne_fm: float) -> float:
    """Share of the FM's NE gain over the VM that the variant captures: (NE_VM - NE_X) / (NE_VM - NE_FM).

    NaN when the FM is not better than the VM (there is no gain to transfer).
    """
    gain = ne_vm - ne_fm
    return float((ne_vm - ne_variant) / gain) if gain > 0 else float("nan")


def summary(labels, probs) -> dict[str, float]:
    return {"log_loss": log_loss(labels, probs), "ne": normalized_entropy(labels, probs), "auc": auc(labels, probs),
            "calibration": calibration(labels, probs), "examples": int(np.asarray(labels).size),
            "ctr": float(np.mean(labels))}
