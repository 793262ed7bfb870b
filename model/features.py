"""Model inputs from request rows and user events, point-in-time correct.

A request at time t sees only the user's events strictly before t (the last ``L`` of them,
oldest first, left-padded with 0). Ids map through a ``Vocab`` built on the training window:
0 is padding, 1 is the out-of-vocabulary bucket for ids never seen in training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

PAD, OOV = 0, 1
CONTEXT = ("hour", "device", "surface")  # context features every model reads


@dataclass
class Vocab:
    """Known values per feature; code = position + 2 (0 padding, 1 OOV)."""

    values: dict[str, list[str]]

    @classmethod
    def fit(cls, requests: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame | None = None) -> "Vocab":
        def uniq(*cols):
            s = pd.concat([c.dropna().astype(str) for c in cols], ignore_index=True)
            return sorted(s.unique().tolist())

        values = {
            "user": uniq(requests["user_id"], events["user_id"]),
            "item": uniq(requests["item_id"], events["item_id"]),
            "device": uniq(requests["device"]),
            "surface": uniq(requests["surface"]),
            "category": uniq(items["category"]) if items is not None and len(items) else [],
        }
        return cls(values)

    def size(self, name: str) -> int:
        return len(self.values[name]) + 2

    def _index(self, name: str) -> pd.Index:
        # Built once per feature: a 300k-id Index costs milliseconds, paid per call it would
        # dominate inference that encodes small batches.
        cache = self.__dict__.setdefault("_indexes", {})
        if name not in cache:
            cache[name] = pd.Index(self.values[name])
        return cache[name]

    def encode(self, name: str, raw) -> np.ndarray:
        idx = self._index(name).get_indexer(pd.Series(raw, dtype="object").astype(str))
        codes = np.where(idx >= 0, idx + 2, OOV).astype(np.int64)
        return np.where(pd.isna(pd.Series(raw, dtype="object")).to_numpy(), PAD, codes)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.values))

    @classmethod
    def load(cls, path: Path) -> "Vocab":
        return cls(json.loads(path.read_text()))


def history_matrix(users: np.ndarray, times: np.ndarray, ev_users: np.ndarray, ev_times: np.ndarray,
                   ev_items: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, L) item codes of each (user, t)'s last ``length`` events strictly before t, and their count.

    Vectorized: events and queries are placed on one (user, time-rank) key axis, so a single
    searchsorted finds, for every query, where its user's earlier events end.
    """
    if length < 1:
        raise ValueError("history length must be >= 1")
    all_users, user_codes = np.unique(np.concatenate([users, ev_users]).astype(str), return_inverse=True)
    q_user, e_user = user_codes[: len(users)], user_codes[len(users):]
    all_times, time_codes = np.unique(np.concatenate([times, ev_times]), return_inverse=True)
    q_time, e_time = time_codes[: len(times)], time_codes[len(times):]
    span = np.int64(len(all_times) + 1)
    e_key = e_user.astype(np.int64) * span + e_time
    order = np.argsort(e_key, kind="stable")
    e_key, e_items = e_key[order], np.asarray(ev_items)[order]
    q_key = q_user.astype(np.int64) * span + q_time
    end = np.searchsorted(e_key, q_key, side="left")  # first event at or after t: strictly-before ends here
    start = np.searchsorted(e_key, q_user.astype(np.int64) * span, side="left")
    idx = end[:, None] - length + np.arange(length)[None, :]  # (N, L), oldest first
    valid = idx >= start[:, None]
    hist = np.where(valid, e_items[np.clip(idx, 0, max(len(e_items) - 1, 0))] if len(e_items) else PAD, PAD)
    return hist.astype(np.int64), valid.sum(axis=1)


def build_examples(requests: pd.DataFrame, events: pd.DataFrame, vocab: Vocab, history_len: int,
                   items: pd.DataFrame | None = None) -> dict[str, np.ndarray]:
    """Arrays for the models. ``requests``: user_id, item_id, ts, label, device, surface;
    ``events``: user_id, item_id, ts. Labels that are NULL are not examples (drop them first)."""
    if len(requests) == 0:
        raise ValueError("no requests to build examples from (empty window?)")
    if requests["label"].isna().any():
        raise ValueError("requests with unknown (NULL) labels cannot be training or evaluation examples")
    ts = pd.to_datetime(requests["ts"]).to_numpy("datetime64[us]").astype(np.int64)
    ev_ts = pd.to_datetime(events["ts"]).to_numpy("datetime64[us]").astype(np.int64)
    hist, hist_len = history_matrix(requests["user_id"].to_numpy(), ts, events["user_id"].to_numpy(), ev_ts,
                                    vocab.encode("item", events["item_id"]), history_len)
    category = np.zeros(len(requests), dtype=np.int64)
    if items is not None and len(items) and vocab.values["category"]:
        cat_of = items.drop_duplicates("item_id").set_index("item_id")["category"]
        category = vocab.encode("category", requests["item_id"].map(cat_of))
    return {
        "user": vocab.encode("user", requests["user_id"]),
        "item": vocab.encode("item", requests["item_id"]),
        "hist": hist,
        "hist_len": hist_len.astype(np.int64),
        "hour": pd.to_datetime(requests["ts"]).dt.hour.to_numpy().astype(np.int64),
        "device": vocab.encode("device", requests["device"]),
        "surface": vocab.encode("surface", requests["surface"]),
        "category": category,
        "label": requests["label"].to_numpy(dtype=np.float32),
    }
