"""Model inputs from request rows, user events and item attributes, point-in-time correct.

Everything a row at time t reads happened strictly before t, and within the FM's look-back
``horizon`` (the same bound the Spark jobs use when they build these inputs as of a run's t):

- the user's last ``L`` events (item ids, categories and how long ago, oldest first, left-padded),
  encoded once per *request*: rows carry ``req``, the index of their request's history row;
- item attributes of the candidate: category and subcategory (``items``);
- counters (``COUNTERS``): the candidate's clicks in the last hour and day, its age since its
  first click, the user's clicks on the candidate's category and in all, and their share;
- context: hour of day, device, surface, and the slot (position) the candidate was shown in.

Ids map through a ``Vocab`` built on the training window: 0 is padding, 1 is the
out-of-vocabulary bucket for ids never seen in training. Position codes are ``slot + 1`` capped at
``MAX_POSITION``; 0 means unknown (a speculated pair has no slot yet).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

PAD, OOV = 0, 1
CONTEXT = ("hour", "device", "surface")  # context features every model reads
MAX_POSITION = 16
HOUR_US, DAY_US = 3_600_000_000, 86_400_000_000
COUNTERS = ("item_clicks_1h", "item_clicks_24h", "item_age_hours", "item_seen", "user_category_clicks",
            "user_clicks", "user_category_share")
REQUEST_KEYS = ("hist", "hist_cat", "hist_age")  # arrays with one row per request (``req`` indexes them)
RECENCY_BUCKETS = 16  # history event age codes: 0 padding, 1 + floor(log2(1 + minutes)) capped


@dataclass
class Vocab:
    """Known values per feature; code = position + 2 (0 padding, 1 OOV)."""

    values: dict[str, list[str]]

    @classmethod
    def fit(cls, requests: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame | None = None) -> "Vocab":
        def uniq(*cols):
            s = pd.concat([c.dropna().astype(str) for c in cols], ignore_index=True)
            return sorted(s.unique().tolist())

        has_items = items is not None and len(items)
        return cls({
            "user": uniq(requests["user_id"], events["user_id"]),
            "item": uniq(requests["item_id"], events["item_id"]),
            "device": uniq(requests["device"]),
            "surface": uniq(requests["surface"]),
            "category": uniq(items["category"]) if has_items else [],
            "subcategory": uniq(items["subcategory"]) if has_items and "subcategory" in items else [],
        })

    @classmethod
    def of_rows(cls, requests: pd.DataFrame) -> "Vocab":
        """A VM's vocabulary: the ids and context of its training rows only. An id seen only in older
        events (or later) reads the unknown row, which the VM's id dropout trains; a row per such id
        would never get a gradient."""
        return cls.fit(requests, requests.iloc[:0][["user_id", "item_id"]])

    def size(self, name: str) -> int:
        return len(self.values.get(name, [])) + 2

    def _index(self, name: str) -> pd.Index:
        # Built once per feature: a 300k-id Index costs milliseconds, paid per call it would
        # dominate inference that encodes small batches.
        cache = self.__dict__.setdefault("_indexes", {})
        if name not in cache:
            cache[name] = pd.Index(self.values.get(name, []))
        return cache[name]

    def encode(self, name: str, raw) -> np.ndarray:
        s = pd.Series(raw, dtype="object")
        idx = self._index(name).get_indexer(s.astype(str))
        codes = np.where(idx >= 0, idx + 2, OOV).astype(np.int64)
        return np.where(pd.isna(s).to_numpy(), PAD, codes)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.values))

    @classmethod
    def load(cls, path: Path) -> "Vocab":
        return cls(json.loads(path.read_text()))


def micros(ts) -> np.ndarray:
    """Timestamps (naive UTC, or zone-aware) as int64 microseconds since the epoch."""
    ts = pd.to_datetime(pd.Series(ts))
    if ts.dt.tz is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    return ts.to_numpy("datetime64[us]").astype(np.int64)


def position_code(position) -> np.ndarray:
    """Slot -> code: 0 unknown (NULL), else slot + 1 capped at MAX_POSITION."""
    s = pd.to_numeric(pd.Series(position, dtype="object"), errors="coerce")
    return np.where(s.isna(), 0, np.clip(s.fillna(0).to_numpy() + 1, 1, MAX_POSITION)).astype(np.int64)


class EventIndex:
    """Events sorted by (key, time), to answer "which events of key k lie in [a, b)" for many
    queries at once with one ``searchsorted`` (keys and times compressed to ranks on one axis)."""

    def __init__(self, keys: np.ndarray, times: np.ndarray, tiebreak: np.ndarray | None = None):
        self.keys, self.times = np.asarray(keys, dtype=np.int64), np.asarray(times, dtype=np.int64)
        tb = np.zeros(len(self.keys), np.int64) if tiebreak is None else np.asarray(tiebreak)
        self.order = np.lexsort((tb, self.times, self.keys))  # by key, then time, then tie-break

    def positions(self, q_keys: np.ndarray, bounds: list[np.ndarray]) -> list[np.ndarray]:
        """For each array of times in ``bounds``: per query, the sorted position of its key's first
        event at or after that time (so [pos(a), pos(b)) are the key's events in [a, b))."""
        q_keys = np.asarray(q_keys, dtype=np.int64)
        all_times = np.unique(np.concatenate([self.times, *bounds]))
        span = np.int64(len(all_times) + 1)
        e = self.keys[self.order] * span + np.searchsorted(all_times, self.times[self.order])
        return [np.searchsorted(e, q_keys * span + np.searchsorted(all_times, b), side="left") for b in bounds]


def _codes(*arrays) -> list[np.ndarray]:
    """Shared integer codes for several arrays of ids (strings or NULL -> -1)."""
    joined = pd.concat([pd.Series(a, dtype="object") for a in arrays], ignore_index=True)
    codes, _ = pd.factorize(joined)
    out, at = [], 0
    for a in arrays:
        out.append(codes[at:at + len(a)].astype(np.int64))
        at += len(a)
    return out


def history_index(users, times, ev_users, ev_times, ev_tiebreak, length: int, horizon_us: int):
    """(N, L) indices into the events (-1 padding) of each (user, t)'s last ``length`` events in
    [t - horizon, t), oldest first; ties in time in ``ev_tiebreak`` order."""
    if length < 1:
        raise ValueError("history length must be >= 1")
    q, e = _codes(users, ev_users)
    ix = EventIndex(e, ev_times, ev_tiebreak)
    start, end = ix.positions(q, [np.asarray(times) - horizon_us, np.asarray(times)])
    idx = end[:, None] - length + np.arange(length)[None, :]  # (N, L), oldest first
    valid = idx >= start[:, None]
    sorted_idx = ix.order[np.clip(idx, 0, max(len(ix.order) - 1, 0))] if len(ix.order) else np.zeros_like(idx)
    return np.where(valid, sorted_idx, -1)


def history_matrix(users, times, ev_users, ev_times, ev_items, length: int,
                   horizon_us: int = 10**18) -> tuple[np.ndarray, np.ndarray]:
    """(N, L) item codes of each (user, t)'s last ``length`` events strictly before t, and their count."""
    idx = history_index(users, times, ev_users, ev_times, None, length, horizon_us)
    items = np.asarray(ev_items)
    hist = np.where(idx >= 0, items[np.maximum(idx, 0)] if len(items) else PAD, PAD)
    return hist.astype(np.int64), (idx >= 0).sum(axis=1)


def window_counts(q_keys, times, ev_keys, ev_times, windows_us: list[int]) -> list[np.ndarray]:
    """Per query (key, t) and window w: how many events of the key lie in [t - w, t)."""
    q, e = _codes(q_keys, ev_keys)
    t = np.asarray(times, dtype=np.int64)
    pos = EventIndex(e, ev_times).positions(q, [t, *(t - w for w in windows_us)])
    return [pos[0] - p for p in pos[1:]]


def first_event_age(q_keys, times, ev_keys, ev_times, horizon_us: int) -> np.ndarray:
    """Hours since the key's first event in [t - horizon, t); NaN when it has none there."""
    q, e = _codes(q_keys, ev_keys)
    t = np.asarray(times, dtype=np.int64)
    ix = EventIndex(e, ev_times)
    lo, hi = ix.positions(q, [t - horizon_us, t])
    first = ix.times[ix.order[np.minimum(lo, max(len(ix.order) - 1, 0))]] if len(ix.order) else np.zeros_like(t)
    return np.where(lo < hi, (t - first) / HOUR_US, np.nan)


def recency_code(age_us) -> np.ndarray:
    """How long before t each history event happened, as a code: 1 + floor(log2(1 + minutes)),
    capped at RECENCY_BUCKETS - 1 (0 is padding). A click minutes ago (the same visit) and one
    days ago read differently."""
    minutes = np.maximum(np.asarray(age_us, np.float64), 0) / 60_000_000
    return np.minimum(1 + np.floor(np.log2(1 + minutes)), RECENCY_BUCKETS - 1).astype(np.int64)


def counter_features(clicks_1h, clicks_24h, age_hours, user_category, user_total) -> np.ndarray:
    """(N, len(COUNTERS)) float32 from raw counts: log-scaled, with a flag for items never clicked
    within the horizon (age unknown). The training and the Spark jobs both call this."""
    c1, c24 = np.asarray(clicks_1h, np.float64), np.asarray(clicks_24h, np.float64)
    age = np.asarray(age_hours, np.float64)
    uc, ut = np.asarray(user_category, np.float64), np.asarray(user_total, np.float64)
    seen = np.isfinite(age)
    share = np.divide(uc, ut, out=np.zeros_like(uc), where=ut > 0)
    return np.stack([np.log1p(c1), np.log1p(c24), np.where(seen, np.log1p(np.where(seen, age, 0)), 0.0),
                     seen.astype(np.float64), np.log1p(uc), np.log1p(ut), share], axis=1).astype(np.float32)


def item_attributes(items: pd.DataFrame | None, item_ids) -> tuple[pd.Series, pd.Series]:
    """(category, subcategory) of each item id; NULL where ``items`` does not know it."""
    ids = pd.Series(item_ids, dtype="object")
    if items is None or not len(items):
        none = pd.Series([None] * len(ids), dtype="object")
        return none, none
    known = items.drop_duplicates("item_id", keep="last").set_index("item_id")
    sub = known["subcategory"] if "subcategory" in known else pd.Series(dtype="object")
    return ids.map(known["category"]), ids.map(sub)


def raw_counts(requests: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame | None,
               horizon_us: int) -> dict[str, np.ndarray]:
    """The counts behind ``COUNTERS`` for every row, as of its ts. Item counts read click events
    only (MIND's pre-log history has no real times); the user's counts read every event."""
    t = micros(requests["ts"])
    ev_t = micros(events["ts"])
    clicks = (events["event_type"] == "click").to_numpy() if "event_type" in events else np.ones(len(events), bool)
    # every count reads the horizon at most, as the Spark jobs' bounded scans do
    c1, c24 = window_counts(requests["item_id"].to_numpy(), t, events["item_id"].to_numpy()[clicks], ev_t[clicks],
                            [min(HOUR_US, horizon_us), min(DAY_US, horizon_us)])
    age = first_event_age(requests["item_id"].to_numpy(), t, events["item_id"].to_numpy()[clicks], ev_t[clicks],
                          horizon_us)
    cand_cat, _ = item_attributes(items, requests["item_id"])
    ev_cat, _ = item_attributes(items, events["item_id"])
    user_q = requests["user_id"].astype(str).to_numpy()
    user_e = events["user_id"].astype(str).to_numpy()
    (total,) = window_counts(user_q, t, user_e, ev_t, [horizon_us])
    # (user, category) as one key; a row or event whose category is unknown matches nothing
    q_key = np.where(cand_cat.isna(), None, user_q + "\x1f" + cand_cat.fillna("").astype(str).to_numpy())
    e_key = np.where(ev_cat.isna(), "\x1e", user_e + "\x1f" + ev_cat.fillna("").astype(str).to_numpy())
    (per_cat,) = window_counts(q_key, t, e_key, ev_t, [horizon_us])
    per_cat = np.where(cand_cat.isna().to_numpy(), 0, per_cat)
    return {"clicks_1h": c1, "clicks_24h": c24, "age_hours": age, "user_category": per_cat, "user_total": total}


def group_rows(keys) -> tuple[np.ndarray, np.ndarray]:
    """(req, first): ``req[i]`` is row i's group (0..R-1, in order of first appearance) and
    ``first[r]`` a row of group r."""
    req, _ = pd.factorize(pd.Series(keys, dtype="object"))
    _, first = np.unique(req, return_index=True)
    return req.astype(np.int64), first


def build_examples(requests: pd.DataFrame, events: pd.DataFrame, vocab: Vocab, history_len: int,
                   items: pd.DataFrame | None = None, horizon_hours: float = 720.0,
                   group_by: str = "request_id") -> dict[str, np.ndarray]:
    """Arrays for the models, in the order of ``requests``. ``requests``: request_id, user_id,
    item_id, ts, label, device, surface[, position]; ``events``: user_id, item_id, ts[, event_type];
    ``items``: item_id, category[, subcategory]. Rows of one ``group_by`` value share one history
    row (they must share the user and ts). Labels that are NULL are not examples (drop them first)."""
    if len(requests) == 0:
        raise ValueError("no requests to build examples from (empty window?)")
    if requests["label"].isna().any():
        raise ValueError("requests with unknown (NULL) labels cannot be training or evaluation examples")
    horizon = int(horizon_hours * HOUR_US)
    # without the grouping column every row is a request of its own
    req, first = group_rows(requests[group_by] if group_by in requests else np.arange(len(requests)))
    heads = requests.iloc[first]
    t_head = micros(heads["ts"])
    ev_t = micros(events["ts"])
    ev_items = events["item_id"].to_numpy()
    _, tiebreak = np.unique(ev_items.astype(str), return_inverse=True)
    idx = history_index(heads["user_id"].to_numpy(), t_head, events["user_id"].to_numpy(), ev_t, tiebreak,
                        history_len, horizon)
    ev_cat, _ = item_attributes(items, ev_items)
    item_codes, cat_codes = vocab.encode("item", ev_items), vocab.encode("category", ev_cat)
    take = np.maximum(idx, 0)
    hist = np.where(idx >= 0, item_codes[take] if len(ev_items) else PAD, PAD)
    hist_cat = np.where(idx >= 0, cat_codes[take] if len(ev_items) else PAD, PAD)
    hist_age = np.where(idx >= 0, recency_code(t_head[:, None] - (ev_t[take] if len(ev_items) else 0)), PAD)
    counts = raw_counts(requests, events, items, horizon)
    cat, sub = item_attributes(items, requests["item_id"])
    return {
        "req": req,
        "hist": hist.astype(np.int64),
        "hist_cat": hist_cat.astype(np.int64),
        "hist_age": hist_age.astype(np.int64),
        "user": vocab.encode("user", requests["user_id"]),
        "item": vocab.encode("item", requests["item_id"]),
        "category": vocab.encode("category", cat),
        "subcategory": vocab.encode("subcategory", sub),
        "counters": counter_features(counts["clicks_1h"], counts["clicks_24h"], counts["age_hours"],
                                     counts["user_category"], counts["user_total"]),
        "hour": pd.to_datetime(requests["ts"]).dt.hour.to_numpy().astype(np.int64),
        "device": vocab.encode("device", requests["device"]),
        "surface": vocab.encode("surface", requests["surface"]),
        "position": position_code(requests["position"]) if "position" in requests else np.zeros(len(requests), np.int64),
        "label": requests["label"].to_numpy(dtype=np.float32),
    }


# The arrays of each input group a model can declare (model/interface.py); label and position go to every model.
GROUP_KEYS = {"context": ("user", "item", "hour", "device", "surface"), "attributes": ("category", "subcategory"),
              "counters": ("counters",), "history": (*REQUEST_KEYS, "req")}


def model_inputs(x: dict[str, np.ndarray], groups) -> dict[str, np.ndarray]:
    """The arrays of ``x`` a model reading ``groups`` takes (and label, position where present)."""
    keep = {"label", "position", *(k for g in groups for k in GROUP_KEYS[g])}
    return {k: v for k, v in x.items() if k in keep}


def last_click_inputs(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per row of ``x`` (``build_examples``' arrays): the item code of its user's last event before
    the request (``last_item``, PAD when none) and its recency code (``last_age``, 0 when none): the
    VM's online session input (model.vm). Strictly before the request, as the history is."""
    return {"last_item": x["hist"][x["req"], -1], "last_age": x["hist_age"][x["req"], -1]}


def row_inputs(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-row arrays only (what a VM reads): without the request-level history."""
    return {k: v for k, v in x.items() if k not in REQUEST_KEYS and k != "req"}


def subset(x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays of the given rows, with only their requests' history rows (``req`` renumbered)."""
    rows = np.asarray(rows)
    out = {k: v[rows] for k, v in x.items() if k not in REQUEST_KEYS and k != "req"}
    if "req" in x:
        kept, req = np.unique(x["req"][rows], return_inverse=True)
        out["req"] = req.astype(np.int64)
        out.update({k: x[k][kept] for k in REQUEST_KEYS if k in x})
    return out
