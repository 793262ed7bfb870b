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

import numpy as np


def normalize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit rows as contiguous float32, mask of rows that could be normalised: finite and non-zero)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1) if len(x) else np.zeros(0, dtype=np.float32)
    ok = np.isfinite(x).all(axis=1) & np.isfinite(norms) & (norms > 0)
    out = np.zeros_like(x)
    out[ok] = x[ok] / norms[ok, None]
    return out, ok


def build_index(vectors: np.ndarray, cfg):
    """The index for unit ``vectors`` (N, d): exact up to ``cfg.exact_search_max``, HNSW above."""
    import faiss

    n, d = vectors.shape
    if n <= cfg.exact_search_max:
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


def neighbors(lender_vectors: np.ndarray, query_vectors: np.ndarray, self_index: np.ndarray, cfg,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """Top-k lenders of every query, excluding the query itself.

    ``self_index[q]`` is query q's own row among the lenders (-1 if it is not a lender). Returns
    (ids (Q, k) with -1 padding, similarities (Q, k), stats with the index kind and recall@k).
    Vectors must already be unit rows (``normalize``).
    """
    index = build_index(lender_vectors, cfg)
    sims, ids = search(index, query_vectors, cfg.neighbors_k + 1)  # one extra: the query may find itself
    own = ids == self_index[:, None]
    # Drop the self match, then keep the first k of what remains in order.
    order = np.argsort(own, axis=1, kind="stable")
    ids = np.take_along_axis(np.where(own, -1, ids), order, axis=1)[:, : cfg.neighbors_k]
    sims = np.take_along_axis(np.where(own, 0.0, sims), order, axis=1)[:, : cfg.neighbors_k].astype(np.float32)
    sims[ids < 0] = 0.0
    rng = np.random.default_rng(seed)
    sample = rng.choice(len(query_vectors), size=min(cfg.recall_sample, len(query_vectors)), replace=False) \
        if len(query_vectors) else np.zeros(0, dtype=np.int64)
    stats = {"index": type(index).__name__, "indexed": int(index.ntotal), "queries": int(len(query_vectors)),
             "recall_at_k": recall_at_k(index, lender_vectors, query_vectors[sample], cfg.neighbors_k)}
    return ids, sims, stats
