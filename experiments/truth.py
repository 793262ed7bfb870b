"""The floor under every model on a simulated log: the Bayes NE and the share of the VM's gap to it
that each model closes.

The synthetic impression world knows the probability each label was drawn with; its ingest writes
it to the ``truth`` table. Only this module reads that table, after the models are trained and
have predicted: the Bayes NE is the NE of predicting the truth itself, and a model's gap share is
(NE_VM - NE_model) / (NE_VM - NE_Bayes), with paired-bootstrap intervals over the test requests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from model import metrics


def read_truth(tables_root, source: str | None = None) -> pd.DataFrame | None:
    """(request_id, item_id, p_click, p_conversion) of ``source``, or None when the lake has none."""
    import pyarrow.compute as pc

    from feature_store.lake import read_arrow
    from feature_store.tables import TRUTH

    try:
        table = read_arrow(tables_root, TRUTH, columns=["request_id", "item_id", "p_click", "p_conversion"],
                           filter=(pc.field("source") == source) if source else None)
    except FileNotFoundError:
        return None
    return table.to_pandas() if table.num_rows else None


def seeded_column(predictions: pd.DataFrame, model: str) -> np.ndarray:
    """A model's predictions: (n,) from its column, or (S, n) from its columns ``<model> [seed s]``
    when it was trained once per seed (the replay's VM variants)."""
    seeded = [c for c in predictions.columns if c.startswith(f"{model} [seed ")]
    return np.stack([predictions[c].to_numpy() for c in seeded]) if seeded else predictions[model].to_numpy()


def bayes_gap(predictions: pd.DataFrame, truth: pd.DataFrame, models: list[str], baseline: str = "VM",
              resamples: int = 1000, seed: int = 7, column: str = "p_click") -> dict:
    """Bayes NE and each model's share of the baseline's gap to it, with intervals.

    ``predictions``: request_id, item_id, label and one column per model; ``truth`` must cover
    every row (a row without its probability is an error, not a silent drop). ``column``: the
    truth of the label predicted, ``p_click`` or ``p_conversion`` (a click and then a conversion)."""
    rows = predictions.merge(truth[["request_id", "item_id", column]], on=["request_id", "item_id"], how="left",
                             validate="one_to_one")
    missing = int(rows[column].isna().sum())
    if missing:
        raise ValueError(f"{missing} of {len(rows)} evaluated rows have no truth: the truth table is of another log")
    y = rows["label"].to_numpy()
    preds = {m: seeded_column(rows, m) for m in models} | {"Bayes": rows[column].to_numpy()}
    ci = metrics.paired_bootstrap(y, preds, rows["request_id"].to_numpy(), baseline=baseline, reference="Bayes",
                                  resamples=resamples, seed=seed)
    ne = {m: metrics.seed_mean_ne(y, p) for m, p in preds.items()}
    out = {"bayes_ne": ne["Bayes"], "bayes_ne_ci": ci["Bayes"]["ne"], "bayes_auc": metrics.auc(y, preds["Bayes"]),
           "label": {"p_click": "click", "p_conversion": "conversion"}.get(column, column), "models": {}}
    for m in models:
        share = metrics.transfer_ratio(ne[baseline], ne[m], ne["Bayes"])
        out["models"][m] = {"ne": ne[m], "gap_share": share, "gap_share_ci": ci[m]["transfer_ratio_ci"],
                            "ne_minus_bayes": ne[m] - ne["Bayes"]}
    return out


def to_markdown(gap: dict) -> str:
    lines = [f"Bayes NE (predicting the true {gap.get('label', 'click')} probability): {gap['bayes_ne']:.4f} "
             f"{metrics.format_interval(gap['bayes_ne_ci'], '.4f')}, AUC {gap['bayes_auc']:.4f}.", "",
             "| model | NE | NE - Bayes NE | share of the VM-to-Bayes gap closed [95% CI] |", "|---|---:|---:|---:|"]
    for m, r in gap["models"].items():
        lo, hi = r["gap_share_ci"]
        share = "" if m == "VM" else f"{100 * r['gap_share']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"
        lines.append(f"| {m} | {r['ne']:.4f} | {r['ne_minus_bayes']:+.4f} | {share} |")
    return "\n".join(lines)


def below_bayes(gap: dict, tolerance: float) -> list[str]:
    """Models whose NE is below the Bayes NE by more than ``tolerance``: impossible in expectation,
    so a sign of a leak (a model reading the truth, or the labels)."""
    return [m for m, r in gap["models"].items() if r["ne_minus_bayes"] < -tolerance and np.isfinite(r["ne"])]
