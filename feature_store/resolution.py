"""The one rule that decides which FM embedding a (user, item) request gets, and a snapshot to apply it to.

For a request at time ``now``, first match wins (``model.tiers.ORDER``):

1. ``exact``: the pair's own row in ``pair_embeddings``;
2. ``item_mean``: the item's row in ``item_mean_embeddings`` (its recent pair embeddings across
   users, time-decayed);
3. ``user_mean``: the user's row in ``user_mean_embeddings``;
4. ``neighbor``: from the user's rows in ``user_neighbors`` (top-k similar users): the
   similarity-weighted mean of the neighbors' exact embeddings of this item, when at least one
   neighbor has one; else the similarity-weighted mean of the neighbors' user means;
5. ``none``: zeros.

A row counts only while ``computed_at <= now < expires_at``, so an expired row is never served,
whether or not cleanup has run. Neighbor weights are the similarities clipped at 0; if every
usable neighbor has similarity <= 0 they weigh equally.

The rule is applied to a ``Snapshot``: the serving tables at fixed Delta versions, held as
contiguous arrays (no Python object per pair). The batch as-of job (spark_jobs/resolve_features.py)
and the online lookup both call ``Snapshot.resolve``, so they cannot disagree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from model.tiers import EXACT, ITEM_MEAN, NEIGHBOR, NONE, ORDER, TIERS, USER_MEAN  # noqa: F401  (re-exported for readers)

_NEVER = np.iinfo(np.int64).min  # expires_at of "no row": never valid
_EPOCH, _MICRO = datetime(1970, 1, 1), timedelta(microseconds=1)


def to_micros(t) -> np.ndarray:
    """UTC microseconds since the epoch of a time or array of times (naive = UTC)."""
    if isinstance(t, datetime):  # one request's time: skip pandas, which costs ~1 ms per call here
        if t.tzinfo is not None:
            t = t.astimezone(timezone.utc).replace(tzinfo=None)
        return np.array([(t - _EPOCH) // _MICRO], np.int64)
    arr = np.atleast_1d(np.asarray(t))
    if np.issubdtype(arr.dtype, np.number):  # an epoch number has no unit; refuse rather than guess
        raise TypeError(f"expected times (datetime, numpy datetime64, pandas Timestamp), got {arr.dtype} numbers")
    idx = pd.DatetimeIndex(pd.to_datetime(arr.astype(object) if arr.dtype.kind == "O" else arr))
    if idx.tz is not None:
        idx = idx.tz_convert("UTC").tz_localize(None)
    return idx.as_unit("us").asi8


def valid_at(validity: np.ndarray, now: np.ndarray) -> np.ndarray:
    """The validity rule on arrays: ``computed_at <= now < expires_at`` for (..., 2) int64 µs
    (computed_at, expires_at). Its Spark form is ``feature_store.lake.valid_at``."""
    return (validity[..., 0] <= now) & (now < validity[..., 1])


def neighbor_weights(similarity: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(m, k) weights summing to 1 over each row's usable neighbors (all 0 where none is usable)."""
    w = np.where(usable, np.clip(similarity, 0.0, None), 0.0)
    total = w.sum(axis=1, keepdims=True)
    uniform = usable / np.maximum(usable.sum(axis=1, keepdims=True), 1)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), uniform).astype(np.float32)


def _micros(col: pa.ChunkedArray) -> np.ndarray:
    if len(col) == 0:
        return np.zeros(0, dtype=np.int64)
    t = col.type
    col = col.cast(pa.timestamp("us", tz=t.tz)) if pa.types.is_timestamp(t) else col
    return col.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _vectors(col: pa.ChunkedArray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """((n, dim) float32, mask of rows that are exactly ``dim`` finite values)."""
    n = len(col)
    if n == 0:
        return np.zeros((0, dim), np.float32), np.zeros(0, bool)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    sizes = pc.list_value_length(col).fill_null(-1).to_numpy(zero_copy_only=False)
    ok = sizes == dim
    out = np.zeros((n, dim), np.float32)
    if ok.any():
        values = pc.list_flatten(col.filter(pa.array(ok))).to_numpy(zero_copy_only=False)
        out[ok] = values.astype(np.float32).reshape(-1, dim)
    ok &= np.isfinite(out).all(axis=1)
    out[~ok] = 0.0
    return out, ok


class EmbeddingSizeMismatch(ValueError):
    """The published tables hold embeddings of another size than the lookup answers with."""


def infer_dim(*columns: pa.ChunkedArray, default: int) -> int:
    """The embedding size most rows have (a few wrong-sized rows must not decide it)."""
    sizes = [pc.list_value_length(c).drop_null().to_numpy(zero_copy_only=False) for c in columns if len(c)]
    sizes = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    if not len(sizes):
        return default
    values, counts = np.unique(sizes.astype(np.int64), return_counts=True)
    return int(values[np.argmax(counts)])


class Codes:
    """Id -> dense code, and back. A dict: for the few hundred ids of one request it is several
    times faster than a pandas Index, whose lookups convert their input first."""

    def __init__(self, ids):
        self.ids = np.asarray(pd.unique(np.asarray(ids, dtype=object)), dtype=object)
        self._code = {x: i for i, x in enumerate(self.ids.tolist())}

    def get_indexer(self, values) -> np.ndarray:
        get = self._code.get
        return np.fromiter((get(v, -1) for v in values), np.int64, len(values))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, code):
        return self.ids[code]


@dataclass
class Snapshot:
    """The serving tables at one published version, as arrays indexed by user and item codes."""

    dim: int
    users: Codes  # user id <-> code
    items: Codes  # item id <-> code
    pair_keys: np.ndarray  # (P,) int64 sorted: user_code * n_items + item_code
    pair_embedding: np.ndarray  # (P, dim) float32
    pair_valid: np.ndarray  # (P, 2) int64 microseconds: computed_at, expires_at
    mean_embedding: np.ndarray  # (U + 1, dim) float32, zeros where a user has no mean
    mean_valid: np.ndarray  # (U + 1, 2); row U (code -1) is never valid
    neighbor_ids: np.ndarray  # (U + 1, k) int64 user codes, -1 = no neighbor
    neighbor_similarity: np.ndarray  # (U + 1, k) float32
    neighbor_valid: np.ndarray  # (U + 1, 2)
    item_mean_embedding: np.ndarray  # (I + 1, dim) float32, zeros where an item has no mean
    item_mean_valid: np.ndarray  # (I + 1, 2); row I (code -1) is never valid
    run_id: str | None = None
    stats: dict = field(default_factory=dict)
    code_version: str | None = None  # the code space of every code it holds (None: not recorded)

    @classmethod
    def empty(cls, dim: int, run_id: str | None = None) -> "Snapshot":
        return cls.from_arrow(None, None, None, dim, run_id)

    @classmethod
    def from_arrow(cls, pairs: pa.Table | None, means: pa.Table | None, neighbors: pa.Table | None,
                   dim: int | None = None, run_id: str | None = None, item_means: pa.Table | None = None) -> "Snapshot":
        """Build from Arrow tables with the declared columns (None = table absent, i.e. empty).

        Rows whose embedding is not ``dim`` finite floats are excluded and counted in
        ``stats["excluded_invalid"]``; ``dim`` defaults to the size most rows have.
        """
        pairs = pairs if pairs is not None else _empty_pairs()
        means = means if means is not None else _empty_means()
        neighbors = neighbors if neighbors is not None else _empty_neighbors()
        item_means = item_means if item_means is not None else _empty_means("item_id")
        held = infer_dim(pairs["embedding"], means["embedding"], item_means["embedding"], default=dim or 32)
        if dim is not None and held != dim:
            # Most rows of another size would all be excluded: a lookup answering zeros for every
            # pair while it says it is ready. Refuse the snapshot, so the store keeps serving the one
            # before (or stays not ready) and says why.
            raise EmbeddingSizeMismatch(
                f"the published embeddings are {held} floats, the lookup answers {dim} (the registry's "
                f"autoencoder, or [serve] dim): publish codes of the autoencoder the lookup is configured for, "
                f"or set [serve] dim = {held}")
        dim = held if dim is None else dim
        p_emb, p_ok = _vectors(pairs["embedding"], dim)
        m_emb, m_ok = _vectors(means["embedding"], dim)
        i_emb, i_ok = _vectors(item_means["embedding"], dim)

        def valid(t):
            return np.stack([_micros(t["computed_at"]), _micros(t["expires_at"])], axis=1) if len(t) \
                else np.zeros((0, 2), np.int64)

        sims = neighbors["similarity"].to_numpy(zero_copy_only=False).astype(np.float32) if len(neighbors) \
            else np.zeros(0, np.float32)
        ranks = neighbors["rank"].to_numpy(zero_copy_only=False).astype(np.int64) if len(neighbors) \
            else np.zeros(0, np.int64)
        return cls.from_columns(
            dim, (_strings(pairs["user_id"]), _strings(pairs["item_id"]), p_emb, p_ok, valid(pairs)),
            (_strings(means["user_id"]), m_emb, m_ok, valid(means)),
            (_strings(neighbors["user_id"]), ranks, _strings(neighbors["neighbor_id"]), sims, valid(neighbors)), run_id,
            (_strings(item_means["item_id"]), i_emb, i_ok, valid(item_means)))

    @classmethod
    def from_columns(cls, dim: int, pairs: tuple, means: tuple, neighbors: tuple, run_id: str | None = None,
                     item_means: tuple | None = None) -> "Snapshot":
        """Build from numpy columns (what ``from_arrow`` and the Redis backend both produce):

        pairs = (user ids, item ids, embeddings (n, dim), usable mask, validity (n, 2) µs);
        means = (user ids, embeddings, usable mask, validity); neighbors = (user ids, ranks from 1,
        neighbor ids, similarities, validity); item_means = (item ids, embeddings, usable mask,
        validity), None for none. Rows not usable are excluded and counted.
        """
        p_users, p_items, emb, ok, valid = pairs
        m_users, m_emb, m_ok, m_valid = means
        n_users_col, ranks, n_ids, sim, n_valid = neighbors
        i_items, i_emb, i_ok, i_valid = item_means if item_means is not None else \
            ([], np.zeros((0, dim), np.float32), np.zeros(0, bool), np.zeros((0, 2), np.int64))
        users = Codes(np.concatenate([np.asarray(c, dtype=object) for c in (p_users, m_users, n_users_col, n_ids)]))
        items = Codes(np.concatenate([np.asarray(c, dtype=object) for c in (p_items, i_items)]))
        n_users, n_items = len(users), max(len(items), 1)

        keys = users.get_indexer(p_users).astype(np.int64) * n_items + items.get_indexer(p_items) if len(p_users) \
            else np.zeros(0, np.int64)
        order = np.argsort(keys[ok], kind="stable")
        pair_keys, pair_embedding, pair_valid = keys[ok][order], emb[ok][order], valid[ok][order]
        dup = np.zeros(len(pair_keys), bool)
        dup[1:] = pair_keys[1:] == pair_keys[:-1]  # a key stored twice: keep the first, count the rest
        excluded = int((~ok).sum())

        # Per-user arrays get one extra, never-valid last row: code -1 (unknown user) indexes it.
        mean_embedding = np.zeros((n_users + 1, dim), np.float32)
        mean_valid = np.full((n_users + 1, 2), _NEVER, np.int64)
        if len(m_users):
            mu = users.get_indexer(m_users)
            mean_embedding[mu[m_ok]] = m_emb[m_ok]
            mean_valid[mu[m_ok]] = m_valid[m_ok]
        excluded += int((~m_ok).sum())

        k = int(ranks.max()) if len(ranks) else 0
        neighbor_ids = np.full((n_users + 1, k), -1, np.int64)
        neighbor_similarity = np.zeros((n_users + 1, k), np.float32)
        neighbor_valid = np.full((n_users + 1, 2), _NEVER, np.int64)
        if len(ranks):
            nu, nv = users.get_indexer(n_users_col), users.get_indexer(n_ids)
            good = (ranks >= 1) & np.isfinite(sim)
            excluded += int((~good).sum())
            neighbor_ids[nu[good], ranks[good] - 1] = nv[good]
            neighbor_similarity[nu[good], ranks[good] - 1] = sim[good]
            neighbor_valid[nu[good]] = n_valid[good]
        item_mean_embedding = np.zeros((len(items) + 1, dim), np.float32)
        item_mean_valid = np.full((len(items) + 1, 2), _NEVER, np.int64)
        if len(i_items):
            ic = items.get_indexer(i_items)
            item_mean_embedding[ic[i_ok]] = i_emb[i_ok]
            item_mean_valid[ic[i_ok]] = i_valid[i_ok]
        excluded += int((~np.asarray(i_ok, bool)).sum())
        stats = {"pairs": int((~dup).sum()), "user_means": int(m_ok.sum()), "item_means": int(np.sum(i_ok)),
                 "users_with_neighbors": int((neighbor_ids >= 0).any(axis=1).sum()) if k else 0,
                 "excluded_invalid": excluded, "duplicate_pairs": int(dup.sum())}
        return cls(dim, users, items, pair_keys[~dup], pair_embedding[~dup], pair_valid[~dup], mean_embedding,
                   mean_valid, neighbor_ids, neighbor_similarity, neighbor_valid, item_mean_embedding, item_mean_valid,
                   run_id, stats)

    @classmethod
    def load(cls, tables_root: str | Path, versions: dict[str, int | None] | None = None, dim: int | None = None,
             run_id: str | None = None) -> "Snapshot":
        """Read the serving tables with delta-rs (no JVM) at the given versions (no versions: the latest).

        A table that does not exist yet is read as empty; one that exists but cannot be read raises.
        Of a publication (``versions`` given), a table it has no version of (published before the
        table existed) is read as empty, never at its latest version.
        """
        from feature_store.lake import read_arrow
        from feature_store.tables import ITEM_MEAN_EMBEDDINGS, PAIR_EMBEDDINGS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS

        published = bool(versions)
        versions = versions or {}
        code_version = versions.get("code_version")  # None: published before code versions, every row read
        read = {}
        for spec, cols, version_column in (
                (PAIR_EMBEDDINGS, PAIR_COLUMNS, "model_version"), (USER_MEAN_EMBEDDINGS, MEAN_COLUMNS, "code_version"),
                (USER_NEIGHBORS, NEIGHBOR_COLUMNS, None), (ITEM_MEAN_EMBEDDINGS, ITEM_MEAN_COLUMNS, "code_version")):
            version = versions.get(f"{spec.name}_version")
            if published and version is None:
                read[spec.name] = None
                continue
            # Only rows of the publication's code space: a code of another FM or autoencoder means
            # something else to the consumer that reads it. (Neighbour lists hold user ids, no codes:
            # what they lend is read from these filtered rows.)
            only = pc.field(version_column) == code_version if code_version and version_column else None
            try:
                read[spec.name] = read_arrow(tables_root, spec, version, columns=list(cols), filter=only)
            except FileNotFoundError:
                if version is not None:  # a published version that is gone is an error, not "empty"
                    raise
                read[spec.name] = None
            except pa.ArrowInvalid as e:  # a table version written before it had the column: no row of this space
                if only is None or f"FieldRef.Name({version_column})" not in str(e):
                    raise
                read[spec.name] = None
        snapshot = cls.from_arrow(read["pair_embeddings"], read["user_mean_embeddings"], read["user_neighbors"], dim,
                                  run_id, read["item_mean_embeddings"])
        snapshot.code_version = code_version
        return snapshot

    def _pairs(self, u: np.ndarray, i: np.ndarray, now: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of the pair in pair_* arrays, whether a valid row exists) for codes u, i (any shape)."""
        keys = u.astype(np.int64) * max(len(self.items), 1) + i
        pos = np.searchsorted(self.pair_keys, keys)
        pos = np.minimum(pos, max(len(self.pair_keys) - 1, 0))
        if not len(self.pair_keys):
            return pos, np.zeros(keys.shape, bool)
        found = (u >= 0) & (i >= 0) & (self.pair_keys[pos] == keys)
        return pos, found & valid_at(self.pair_valid[pos], now)

    def _mean_ok(self, u: np.ndarray, now: np.ndarray) -> np.ndarray:
        return valid_at(self.mean_valid[u], now)

    def resolve(self, user_ids, item_ids, now) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings (n, dim) float32, tier codes (n,) int8) for n rows of (user, item, time).

        ``now`` is one time for all rows or one per row (naive = UTC). Unknown users and items
        are not errors: they fall through to the tiers that apply, down to ``none``.
        """
        user_ids, item_ids = np.asarray(user_ids, dtype=object), np.asarray(item_ids, dtype=object)
        n = len(item_ids)
        u = self.users.get_indexer(user_ids) if n else np.zeros(0, np.int64)
        i = self.items.get_indexer(item_ids) if n else np.zeros(0, np.int64)
        return self._resolve_codes(u, i, now)

    def _resolve_codes(self, u: np.ndarray, i: np.ndarray, now) -> tuple[np.ndarray, np.ndarray]:
        """``resolve`` on user and item codes (-1: unknown), ``now`` one time or one per row."""
        n = len(i)
        now = np.broadcast_to(to_micros(now), (n,)) if n else np.zeros(0, np.int64)
        out = np.zeros((n, self.dim), np.float32)
        tier = np.full(n, NONE, np.int8)

        pos, exact = self._pairs(u, i, now)
        out[exact] = self.pair_embedding[pos[exact]]
        tier[exact] = EXACT

        item = ~exact & valid_at(self.item_mean_valid[i], now)
        out[item] = self.item_mean_embedding[i[item]]
        tier[item] = ITEM_MEAN

        mean = (tier == NONE) & self._mean_ok(u, now)
        out[mean] = self.mean_embedding[u[mean]]
        tier[mean] = USER_MEAN

        rest = np.flatnonzero((tier == NONE) & valid_at(self.neighbor_valid[u], now)) \
            if self.neighbor_ids.shape[1] else np.zeros(0, np.int64)
        if len(rest):
            nb = self.neighbor_ids[u[rest]]  # (m, k)
            sim = self.neighbor_similarity[u[rest]]
            t_rest = now[rest][:, None]
            npos, n_exact = self._pairs(nb, np.broadcast_to(i[rest][:, None], nb.shape), t_rest)
            n_exact &= nb >= 0
            n_mean = self._mean_ok(nb, t_rest)
            from_exact = n_exact.any(axis=1)
            from_mean = ~from_exact & n_mean.any(axis=1)
            w_exact = neighbor_weights(sim, n_exact)
            w_mean = neighbor_weights(sim, n_mean)
            emb = np.where(from_exact[:, None],
                           np.einsum("mk,mkd->md", w_exact, self.pair_embedding[npos] if len(self.pair_keys)
                                     else np.zeros(nb.shape + (self.dim,), np.float32)),
                           np.einsum("mk,mkd->md", w_mean, self.mean_embedding[nb]))
            got = from_exact | from_mean
            out[rest[got]] = emb[got]
            tier[rest[got]] = NEIGHBOR
        return out, tier

    def lookup(self, user_id: str, item_ids, now) -> tuple[np.ndarray, np.ndarray]:
        """One request: ``resolve`` for one user and one time over its candidate items."""
        # The user's code once, not once per candidate: this is the online hot path.
        u = np.full(len(item_ids), self.users.get_indexer((user_id,))[0], np.int64)
        return self._resolve_codes(u, self.items.get_indexer(item_ids), now)


PAIR_COLUMNS = ("user_id", "item_id", "embedding", "computed_at", "expires_at")
MEAN_COLUMNS = ("user_id", "embedding", "computed_at", "expires_at")
NEIGHBOR_COLUMNS = ("user_id", "rank", "neighbor_id", "similarity", "computed_at", "expires_at")
ITEM_MEAN_COLUMNS = ("item_id", "embedding", "computed_at", "expires_at")


def _strings(col) -> np.ndarray:
    return np.asarray(col.to_pylist() if len(col) else [], dtype=object)


def _empty(schema: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({k: pa.array([], type=t) for k, t in schema.items()})


def _empty_pairs() -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    return _empty({"user_id": pa.string(), "item_id": pa.string(), "embedding": pa.list_(pa.float32()),
                   "computed_at": ts, "expires_at": ts})


def _empty_means(key: str = "user_id") -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    return _empty({key: pa.string(), "embedding": pa.list_(pa.float32()), "computed_at": ts, "expires_at": ts})


def _empty_neighbors() -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    return _empty({"user_id": pa.string(), "rank": pa.int32(), "neighbor_id": pa.string(),
                   "similarity": pa.float32(), "computed_at": ts, "expires_at": ts})


@functools.lru_cache(maxsize=2)
def cached_snapshot(tables_root: str, versions: tuple[tuple[str, int], ...], dim: int, run_id: str) -> Snapshot:
    """One loaded snapshot per (tables, versions) and process: Spark workers resolve many batches."""
    return Snapshot.load(tables_root, dict(versions), dim, run_id)
