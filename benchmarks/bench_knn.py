"""KNN index: exact (IndexFlatIP) against HNSW (IndexHNSWFlat) at 10^4, 10^5 and 10^6 users.

    python benchmarks/bench_knn.py [--sizes 10000,100000,1000000] [--dim 128] [--queries 1000]

Vectors are synthetic, clustered (a mixture of 1,000 Gaussian tastes, as user embeddings are)
and unit-normalised at the FM user-vector size (2 x FM dim = 128 by default). For each size it
times the index build (model.knn.build_index with exact_max forced below/above N), the search of
``--queries`` users for k = 10 + 1 (the job asks one extra to drop the user itself), and
recall@10 of HNSW against exact search on the same queries. Ratios are HNSW / exact in this run.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import numpy as np


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((1000, dim)).astype(np.float32)
    x = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return x


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    a = p.parse_args(argv)

    import faiss

    from include.config import FallbackConfig
    from model.knn import build_index, normalize, recall_at_k, search

    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads; d={a.dim}, k={a.k}, "
          f"{a.queries} queries")
    print("| users | index | build s | search s | queries/s | recall@k | build ratio | search ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in a.sizes.split(",")):
        vecs, _ = normalize(clustered(n, a.dim))
        queries = vecs[np.random.default_rng(1).choice(n, a.queries, replace=False)]
        base = FallbackConfig(neighbors_k=a.k)
        res = {}
        for kind, cfg in (("exact", replace(base, exact_search_max=n)), ("hnsw", replace(base, exact_search_max=0))):
            t0 = time.perf_counter()
            index = build_index(vecs, cfg)
            built = time.perf_counter() - t0
            t0 = time.perf_counter()
            search(index, queries, a.k + 1)
            searched = time.perf_counter() - t0
            recall = recall_at_k(index, vecs, queries, a.k)  # exact against itself: a check of the harness
            res[kind] = (built, searched, recall, type(index).__name__)
        for kind in ("exact", "hnsw"):
            built, searched, recall, name = res[kind]
            ratio_b = built / res["exact"][0] if res["exact"][0] > 0 else float("nan")
            ratio_s = searched / res["exact"][1]
            print(f"| {n:,} | {name} | {built:.2f} | {searched:.3f} | {a.queries / searched:,.0f} | "
                  f"{recall:.3f} | {ratio_b:.1f}x | {ratio_s:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
