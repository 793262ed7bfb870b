"""Ranking metrics: log loss, normalized entropy, AUC, calibration, transfer ratio, and their
confidence intervals by a paired bootstrap over requests.

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


def seed_mean_ne(labels, probs) -> float:
    """NE of (n,) predictions, or the mean NE over the rows of (S, n) predictions (one per training seed)."""
    return float(np.mean([normalized_entropy(labels, row) for row in np.atleast_2d(probs)]))


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
    """NE, AUC, calibration and log loss of one model; of (S, n) predictions (one row per training
    seed), the mean of each over the seeds."""
    p = np.asarray(probs)
    if p.ndim == 2:
        rows = [summary(labels, row) for row in p]
        return {k: float(np.mean([r[k] for r in rows])) if k != "examples" else rows[0][k] for k in rows[0]} \
            | {"seeds": len(rows)}
    return {"log_loss": log_loss(labels, probs), "ne": normalized_entropy(labels, probs), "auc": auc(labels, probs),
            "calibration": calibration(labels, probs), "examples": int(np.asarray(labels).size),
            "ctr": float(np.mean(labels))}


def _weighted_ne(y: np.ndarray, ll: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NE per row of weights ``w`` (R, n): weighted mean log loss over the entropy of the weighted CTR."""
    total = w.sum(axis=1)
    ctr = np.clip((w @ y) / total, EPS, 1 - EPS)
    return ((w @ ll) / total) / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))


def _weighted_auc(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """AUC per row of weights ``w`` (R, n), ties counted half: the Mann-Whitney statistic with weights."""
    order = np.argsort(p, kind="mergesort")
    sp, sy, sw = p[order], y[order], w[:, order]
    group = np.r_[0, np.cumsum(np.diff(sp) != 0)]  # tie group of each sorted example
    n_groups = group[-1] + 1 if len(group) else 0
    pos = np.zeros((len(w), n_groups))
    neg = np.zeros((len(w), n_groups))
    np.add.at(pos.T, group, (sw * sy).T)
    np.add.at(neg.T, group, (sw * (1 - sy)).T)
    below = np.cumsum(neg, axis=1) - neg  # negative weight strictly below each tie group
    wp, wn = pos.sum(axis=1), neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((wp > 0) & (wn > 0), (pos * (below + 0.5 * neg)).sum(axis=1) / (wp * wn), np.nan)


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    ok = samples[np.isfinite(samples)]
    if not len(ok):
        return float("nan"), float("nan")
    lo, hi = np.quantile(ok, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def paired_bootstrap(labels, preds: dict[str, np.ndarray], groups, baseline: str, reference: str | None = None,
                     resamples: int = 1000, seed: int = 7, level: float = 0.95, chunk: int = 100) -> dict[str, dict]:
    """Confidence intervals of each model's NE and AUC and of its difference from ``baseline``, by a
    paired bootstrap over ``groups`` (request ids): each resample draws requests with replacement and
    every model is scored on the same draw, so the intervals of the deltas account for the models
    sharing their test rows. With ``reference`` (the FM), also each model's transfer ratio
    (NE_base - NE_x) / (NE_base - NE_ref) and whether the reference beats the baseline: its NE
    delta interval lies wholly below zero. Seeded: the same inputs give the same intervals.

    A model's predictions may be (S, n), one row per training seed: its NE and AUC are then the
    means over the seeds, and each resample also draws S seeds with replacement (hierarchically:
    seeds, then requests), so the intervals cover training noise and the test requests together.

    Returns model -> {"ne": (lo, hi), "auc": (lo, hi), "ne_delta_pct": point, "ne_delta_pct_ci": (lo, hi),
    "auc_delta": point, "auc_delta_ci": (lo, hi), ["transfer_ratio_ci": (lo, hi)]}, plus
    "_meta": {"resamples", "level", "groups", "reference_beats_baseline"}.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if baseline not in preds or (reference is not None and reference not in preds):
        raise ValueError(f"baseline {baseline!r} and reference {reference!r} must be among the models {list(preds)}")
    # (S, n): a model trained with S seeds has a row of predictions per seed; one model, one row
    ps = {name: np.atleast_2d(np.asarray(p, dtype=np.float64)) for name, p in preds.items()}
    n_seeds = max(p.shape[0] for p in ps.values())
    if any(p.shape[0] not in (1, n_seeds) for p in ps.values()):
        raise ValueError(f"every model needs 1 or {n_seeds} rows of predictions (one per seed), got "
                         f"{ {k: p.shape[0] for k, p in ps.items()} }")
    y = None
    lls = {}
    for name, p in ps.items():
        checked = [_check(labels, row) for row in p]
        y = checked[0][0]
        ps[name] = np.stack([c[1] for c in checked])
        lls[name] = -(y * np.log(ps[name]) + (1 - y) * np.log(1 - ps[name]))
    codes, group_of = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    if len(group_of) != len(y):
        raise ValueError(f"groups and labels differ in length: {len(group_of)} vs {len(y)}")
    rng = np.random.default_rng(seed)
    seed_rng = np.random.default_rng([seed, 1])  # its own stream: the requests drawn do not depend on S
    ne = {n: [] for n in preds}
    au = {n: [] for n in preds}
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        counts = rng.multinomial(len(codes), np.full(len(codes), 1 / len(codes)), size=r)  # (r, G) requests drawn
        w = counts[:, group_of].astype(np.float64)  # (r, n): each row weighs every candidate of its request
        # Several seeds: each resample also draws S seeds with replacement (the same draw for every
        # model), so the interval covers training noise as well as the test requests.
        draws = seed_rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=r) / n_seeds if n_seeds > 1 \
            else np.ones((r, 1))  # (r, S) weight of each seed in each resample
        for n in preds:
            k = len(ps[n])
            mix = draws if k == n_seeds else np.ones((r, 1))
            ne[n].append(sum(mix[:, s] * _weighted_ne(y, lls[n][s], w) for s in range(k)))
            au[n].append(sum(mix[:, s] * _weighted_auc(y, ps[n][s], w) for s in range(k)))
    ne = {n: np.concatenate(v) for n, v in ne.items()}
    au = {n: np.concatenate(v) for n, v in au.items()}
    point_ne = {n: seed_mean_ne(y, ps[n]) for n in preds}
    point_auc = {n: float(np.mean([auc(y, row) for row in ps[n]])) for n in preds}
    out = {}
    for n in preds:
        delta = 100 * (ne[n] - ne[baseline]) / ne[baseline]
        out[n] = {"ne": _interval(ne[n], level), "auc": _interval(au[n], level),
                  "ne_delta_pct": float(100 * (point_ne[n] - point_ne[baseline]) / point_ne[baseline]),
                  "ne_delta_pct_ci": _interval(delta, level),
                  "auc_delta": float(point_auc[n] - point_auc[baseline]), "auc_delta_ci": _interval(au[n] - au[baseline], level)}
    beats = None
    if reference is not None:
        gain = ne[baseline] - ne[reference]
        beats = bool(out[reference]["ne_delta_pct_ci"][1] < 0)
        for n in preds:
            with np.errstate(invalid="ignore", divide="ignore"):
                out[n]["transfer_ratio_ci"] = _interval(np.where(gain != 0, (ne[baseline] - ne[n]) / gain, np.nan), level)
    out["_meta"] = {"resamples": resamples, "level": level, "groups": int(len(codes)), "seeds": n_seeds,
                    "reference_beats_baseline": beats}
    return out


def format_interval(interval: tuple[float, float], fmt: str) -> str:
    """``[lo, hi]`` with ``fmt`` (e.g. ``".4f"``, ``"+.2f"``): how reports print an interval."""
    lo, hi = interval
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def transfer_label(ratio: float, ci: tuple[float, float] | None, reference_beats_baseline: bool | None,
                   leaking: bool = False) -> str:
    """How a report prints a transfer ratio: only when the FM beats the VM with an interval excluding
    zero, and never on leaking candidates (the ratio would measure the generator)."""
    if leaking:
        return "n/a: leaking candidates"
    if not reference_beats_baseline or not np.isfinite(ratio):
        return "n/a: FM not better"
    return f"{100 * ratio:.0f}% [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci else f"{100 * ratio:.0f}%"


def auc_from_histogram(values, positives, negatives) -> float:
    """AUC of a score that takes few distinct values, from its histogram: per value, the positive and
    negative counts (ties count half). Equals ``auc`` on the rows the histogram counts; NaN with one class."""
    v = np.asarray(values, dtype=np.float64)
    pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    v, pos, neg = v[order], pos[order], neg[order]
    starts = np.r_[0, np.flatnonzero(np.diff(v)) + 1]  # merge equal values
    pos, neg = np.add.reduceat(pos, starts) if len(v) else pos, np.add.reduceat(neg, starts) if len(v) else neg
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))
