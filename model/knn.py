"""Nearest users by cosine similarity with FAISS, through one index factory.

Vectors are L2-normalised so inner product is cosine. Up to ``exact_max`` indexed vectors the
index is exact (``IndexFlatIP``); above it, HNSW (``IndexHNSWFlat``, inner product), which needs
no training pass and keeps recall high at a fraction of the exact cost. Whatever the index,
``recall_at_k`` measures it against exact search on a sample of queries, so the job can report
what the approximation costs instead of assuming it.

``cfg`` is the ``[fallback]`` config section (include/config.py ``FallbackConfig``): neighbors_k,
exact_search_max, hnsw_m, hnsw_ef_construction, hnsw_ef_search, recall_sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def normalize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit rows as contiguous float32, mask of rows that could be normalised: finite and non-zero)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1) if len(x) else np.zeros(0, dtype=np.float32)
    ok = np.isfinite(x).all(axis=1) & np.isfinite(norms) & (norms > 0)
    out = np.zeros_like(x)
    out[ok] = x[ok] / norms[ok, None]
    return out, ok


def index_kind(n: int, cfg) -> str:
    """The FAISS index class ``build_index`` makes for ``n`` vectors."""
    return "IndexFlatIP" if n <= cfg.exact_search_max else "IndexHNSWFlat"


def build_index(vectors: np.ndarray, cfg):
    """The index for unit ``vectors`` (N, d): exact up to ``cfg.exact_search_max``, HNSW above."""
    import faiss

    n, d = vectors.shape
    if index_kind(n, cfg) == "IndexFlatIP":
        index = faiss.IndexFlatIP(d)
    else:
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        index.hnsw.efSearch = cfg.hnsw_ef_search
    index.add(vectors)
    return index


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(similarities, ids), each (Q, k); id -1 where fewer than k neighbours exist."""
    k = min(k, index.ntotal)
    if k == 0 or len(queries) == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


def recall_at_k(index, vectors: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Share of the exact top-k ids that ``index`` also returns, over ``queries``."""
    import faiss

    if len(queries) == 0 or index.ntotal == 0:
        return float("nan")
    k = min(k, index.ntotal)
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, k)
    _, got = index.search(queries, k)
    hits = sum(len(set(t[t >= 0]) & set(g[g >= 0])) for t, g in zip(truth, got))
    return hits / max(int((truth >= 0).sum()), 1)


def _search_without_self(index, index_rows: np.ndarray, queries: np.ndarray, query_rows: np.ndarray,
                         depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows (Q, depth) with -1 padding, similarities (Q, depth)) of each query's top ``depth`` in
    ``index``, whose entry j is the caller's row ``index_rows[j]``; a query's own row is skipped."""
    sims, ids = search(index, queries, depth + 1)  # one extra: the query may find itself
    rows = np.where(ids >= 0, index_rows[np.maximum(ids, 0)], -1)
    own = rows == query_rows[:, None]
    # Drop the self match, then keep the first ``depth`` of what remains in order.
    order = np.argsort(own, axis=1, kind="stable")
    rows = np.take_along_axis(np.where(own, -1, rows), order, axis=1)[:, :depth]
    sims = np.take_along_axis(np.where(own, 0.0, sims), order, axis=1)[:, :depth].astype(np.float32)
    sims[rows < 0] = 0.0
    if rows.shape[1] < depth:  # fewer indexed vectors than asked: pad
        pad = depth - rows.shape[1]
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        sims = np.pad(sims, ((0, 0), (0, pad)))
    return rows, sims


def _sampled_recall(lender_vectors, query_vectors, self_index, got: np.ndarray, k: int, sample: int, seed: int) -> float:
    """Share of the exact top-k (without self) that ``got`` (Q, k rows into the lenders) matches, on a
    seeded sample of the queries: what the index, or an incremental update, cost against exact
    search. A found lender as similar as the exact k-th counts as a match: among tied lenders
    (identical vectors, e.g. users the FM does not know and with the same history) any is right."""
    import faiss

    if len(query_vectors) == 0 or len(lender_vectors) == 0 or k == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(query_vectors), size=min(sample, len(query_vectors)), replace=False))
    exact = faiss.IndexFlatIP(lender_vectors.shape[1])
    exact.add(np.ascontiguousarray(lender_vectors, dtype=np.float32))
    truth, truth_sims = _search_without_self(exact, np.arange(len(lender_vectors)), query_vectors[pick],
                                             self_index[pick], k)
    need = (truth >= 0).sum(axis=1)
    kth = truth_sims[np.arange(len(pick)), np.maximum(need - 1, 0)]
    found = got[pick][:, :k]
    sims = np.einsum("qd,qkd->qk", query_vectors[pick], lender_vectors[np.maximum(found, 0)])
    hits = np.minimum(((found >= 0) & (sims >= kth[:, None] - 1e-5)).sum(axis=1), need)
    return float(hits.sum() / max(int(need.sum()), 1))


def neighbors(lender_vectors: np.ndarray, query_vectors: np.ndarray, self_index: np.ndarray, cfg,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """Top-k lenders of every query, excluding the query itself.

    ``self_index[q]`` is query q's own row among the lenders (-1 if it is not a lender). Returns
    (ids (Q, k) with -1 padding, similarities (Q, k), stats with the index kind and recall@k).
    Vectors must already be unit rows (``normalize``).
    """
    index = build_index(lender_vectors, cfg)
    k = min(cfg.neighbors_k, index.ntotal)
    ids, sims = _search_without_self(index, np.arange(index.ntotal), query_vectors, self_index, k)
    stats = {"index": type(index).__name__, "indexed": int(index.ntotal), "queries": int(len(query_vectors)),
             "recall_at_k": _sampled_recall(lender_vectors, query_vectors, self_index, ids, k, cfg.recall_sample, seed)}
    return ids, sims, stats


@dataclass
class Candidates:
    """Per user, an exact top-m of the lenders of one build, in rank order (flat arrays sorted by
    user, then rank): ``user`` and ``lender`` are rows of that build's users. ``complete[u]``: u's
    list holds every lender but u, so no lender outside it can outrank one inside."""

    user: np.ndarray  # (M,) int64
    lender: np.ndarray  # (M,) int64
    similarity: np.ndarray  # (M,) float32
    complete: np.ndarray  # (N,) bool


def update_neighbors(unit: np.ndarray, is_lender: np.ndarray, fresh: np.ndarray, was_lender: np.ndarray,
                     previous: Candidates, order_key: np.ndarray, cfg, depth: int,
                     seed: int = 0) -> tuple[Candidates, dict]:
    """Every user's top-``depth`` lenders now, searching only what changed since the previous build.

    ``unit`` (N, d): the users' unit vectors now; ``is_lender`` (N,): in the index now; ``fresh``
    (N,): the vector is new or changed since the previous build (or there was none);
    ``was_lender`` (N,): in the previous build's index; ``previous``: that build's lists, with
    lender rows already mapped to this build's rows (-1: the lender is no longer represented);
    ``order_key`` (N,): a total order of the users (ties in similarity go to the lower key).

    A user keeps its previous list, less the lenders that left or moved, merged with a search of the
    lenders that joined or moved. That is exact: every unchanged lender outside the previous list
    ranks below all of that list. Only a fresh user, or one left with fewer than k lenders that
    surely rank above every lender outside its list, is searched against the whole index. What is
    not exact is the HNSW index itself above ``exact_search_max`` lenders; ``recall_at_k``
    measures the final lists against exact search.
    """
    n, k = len(unit), cfg.neighbors_k
    lender_rows = np.flatnonzero(is_lender)
    others = len(lender_rows) - is_lender.astype(np.int64)  # lenders a user can borrow from
    joined = np.flatnonzero(is_lender & (fresh | ~was_lender))
    part_rows = np.flatnonzero(~fresh)

    # Users whose vector did not move: their previous list, less the lenders that left or moved
    # (``stays``: an unchanged vector still indexed, so its old similarity holds), merged with a
    # search of the joined lenders. Below ``floor`` a lender outside the merged list could outrank
    # one inside: an unchanged lender missing from an incomplete previous list ranks at most at
    # that list's last entry. Joined lenders past the depth rank below the depth found, so the
    # merged top ``depth`` stays exact; only the list's completeness is lost.
    stays = is_lender & ~fresh
    keep = (previous.lender >= 0) & stays[np.maximum(previous.lender, 0)] & ~fresh[previous.user]
    parts = [(previous.user[keep], previous.lender[keep], previous.similarity[keep])]
    last = np.full(n, np.inf, np.float32)
    np.minimum.at(last, previous.user, previous.similarity)
    floor = np.where(previous.complete, -np.inf, last).astype(np.float32)
    complete = previous.complete & ~fresh
    if len(joined) and len(part_rows):
        rows, sims = _search_without_self(build_index(unit[joined], cfg), joined, unit[part_rows], part_rows, depth)
        parts.append(_flat(part_rows, rows, sims))
        in_joined = np.zeros(n, bool)
        in_joined[joined] = True
        complete[part_rows[len(joined) - in_joined[part_rows] > depth]] = False
    u, r, s = (np.concatenate(x) for x in zip(*parts))
    sure = s >= floor[u]
    u, r, s = u[sure], r[sure], s[sure]
    # A user left with fewer sure lenders than it can have is searched against the whole index.
    full = fresh | (~complete & (np.bincount(u, minlength=n) < np.minimum(k, others)))
    full_rows = np.flatnonzero(full)
    mine = ~full[u]
    u, r, s = u[mine], r[mine], s[mine]
    if len(full_rows):  # an HNSW build costs seconds: only when someone needs the whole index
        index = build_index(unit[lender_rows], cfg)
        fu, fr, fs = _flat(full_rows, *_search_without_self(index, lender_rows, unit[full_rows], full_rows, depth))
        u, r, s = np.concatenate([u, fu]), np.concatenate([r, fr]), np.concatenate([s, fs])
        complete[full_rows] = others[full_rows] <= depth

    order = np.lexsort((order_key[r], -s, u))
    u, r, s = u[order], r[order], s[order]
    rank = ranks(u)
    cut = rank >= depth
    complete[np.unique(u[cut])] = False
    u, r, s = u[~cut], r[~cut], s[~cut]
    out = Candidates(u.astype(np.int64), r.astype(np.int64), s.astype(np.float32), complete)

    top = top_k(out, n, k)
    self_index = np.full(n, -1, np.int64)
    self_index[lender_rows] = np.arange(len(lender_rows))
    got = np.where(top >= 0, np.searchsorted(lender_rows, np.maximum(top, 0)), -1)
    stats = {"index": index_kind(len(lender_rows), cfg), "indexed": int(len(lender_rows)), "queries": int(n),
             "searched_whole_index": int(len(full_rows)), "searched_joined_only": int(n - len(full_rows)),
             "joined_lenders": int(len(joined)),
             "recall_at_k": _sampled_recall(unit[lender_rows], unit, self_index, got, min(k, len(lender_rows)),
                                            cfg.recall_sample, seed)}
    return out, stats


def _flat(query_rows: np.ndarray, rows: np.ndarray, sims: np.ndarray):
    """(user, lender, similarity) flat arrays of the found entries of a (Q, depth) search result."""
    q, c = np.nonzero(rows >= 0)
    return query_rows[q], rows[q, c], sims[q, c]


def ranks(user: np.ndarray) -> np.ndarray:
    """0-based position of each entry within its user's run of a user-sorted flat list."""
    return np.arange(len(user)) - np.searchsorted(user, user, side="left")


def top_k(c: Candidates, n: int, k: int) -> np.ndarray:
    """(n, k) lender rows of each user's first k candidates, -1 padded."""
    out = np.full((n, k), -1, np.int64)
    rank = ranks(c.user)
    first = rank < k
    out[c.user[first], rank[first]] = c.lender[first]
    return out
