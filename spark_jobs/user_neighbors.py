"""Neighbor table for the run at t: each active user's top-k most similar users that can lend.

User representation: the FM's user-only pass (``FoundationModel.user_vector``: the user id
embedding and the encoded history as of t, no candidate). It is chosen over the mean pair
embedding because the neighbor tier exists for users *without* pair embeddings or a user mean:
a representation built from those would be missing exactly where it is needed. It comes from
the same FM as the pair embeddings, and it needs only the user's history.

Lenders (the indexed side) are users with a user mean valid at t; queries are the users with a
request or an event in the representation window, plus the lenders. Vectors are computed inside
Spark (``mapInPandas``), collected to the driver and searched with FAISS (model/knn.py: exact
inner product on unit vectors up to ``exact_search_max`` lenders, HNSW above), with recall@k
against exact search measured and printed. Each build replaces the whole table.

    python -m spark_jobs.user_neighbors --at 2026-01-05T12:00:00 [--config F]   (after user_means)
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store.tables import (ITEMS, REQUEST_LOG, USER_EVENTS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS, conform,
                                  ensure_tables, in_time_range, qualified_name)
from feature_store import lake
from include.cli import print_counters, run_at_time
from model.interface import BUILTIN_FM
from spark_jobs import embed_pairs
from spark_jobs.embed_pairs import fm_device


def user_vectors(users_with_history: DataFrame, fm_path: str, ae_path: str, t: datetime,
                 device: str = "cpu", allowed: frozenset[str] = frozenset({BUILTIN_FM}),
                 task_gpus: float = 0.0) -> DataFrame:
    """Add ``vector`` (array<float>): the FM user-only pass as of t of rows with user_id and the
    history columns of ``embed_pairs.histories``. ``task_gpus``: as ``embed_pairs.embed``."""

    def run(batches):
        import pandas as pd

        from model.inference import fm_user_vectors

        on = embed_pairs.task_device(device)
        for pdf in batches:
            v = fm_user_vectors(pdf.assign(ts=pd.Timestamp(t)), fm_path, ae_path, device=on, allowed=allowed)
            yield pd.DataFrame({"user_id": pdf["user_id"], "vector": list(v)})

    return users_with_history.mapInPandas(run, "user_id string, vector array<float>",
                                          profile=embed_pairs.gpu_profile(task_gpus) if task_gpus else None)


def neighbor_rows(user_ids: np.ndarray, lender_ids: np.ndarray, ids: np.ndarray, sims: np.ndarray):
    """(user_id, rank, neighbor_id, similarity) tuples for every found neighbor (id >= 0)."""
    q, r = np.nonzero(ids >= 0)
    return list(zip(user_ids[q].tolist(), (r + 1).tolist(), lender_ids[ids[q, r]].tolist(),
                    sims[q, r].astype(float).tolist()))


def run(spark, cfg, t: datetime) -> dict:
    from model import interface, registry
    from model.knn import neighbors, normalize
    from model.registry import resolve_models

    started = time.perf_counter()
    fb, db = cfg.fallback, cfg.lake.database
    run_id = lake.run_id(t)
    ensure_tables(spark, cfg, (REQUEST_LOG, USER_EVENTS, ITEMS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS))
    models = resolve_models(cfg)
    fm_cfg = registry.read_json(models["fm"], "config.json")["config"]
    fm_cls = interface.fm_class(registry.stored_class(models["fm"]), cfg.allowed_classes)  # refused here if not allowed
    since = t - timedelta(hours=fb.representation_window_hours)
    lenders = (spark.table(qualified_name(USER_MEAN_EMBEDDINGS, db))
               .where(lake.valid_at(t)).select("user_id"))
    active = (in_time_range(spark.table(qualified_name(REQUEST_LOG, db)), since, t).select("user_id")
              .unionByName(in_time_range(spark.table(qualified_name(USER_EVENTS, db)), since, t).select("user_id"))
              .unionByName(lenders).distinct())
    if "history" in fm_cls.inputs:
        hist = embed_pairs.histories(spark.table(qualified_name(USER_EVENTS, db)), active, t, fm_cfg["history_len"],
                                     fm_cfg["horizon_hours"], spark.table(qualified_name(ITEMS, db)))
        active = active.join(hist, "user_id", "left")
    device, task_gpus = fm_device(cfg)
    vecs = user_vectors(active, models["fm"], models["autoencoder"], t, device, cfg.allowed_classes,
                        task_gpus).toPandas()
    lender_set = {r.user_id for r in lenders.collect()}

    user_ids = vecs["user_id"].to_numpy(dtype=object)
    unit, ok = normalize(np.stack(vecs["vector"].to_numpy()) if len(vecs) else np.zeros((0, 1), np.float32))
    user_ids, unit = user_ids[ok], unit[ok]
    is_lender = np.fromiter((u in lender_set for u in user_ids), bool, len(user_ids))
    lender_ids = user_ids[is_lender]
    self_index = np.full(len(user_ids), -1, np.int64)
    self_index[is_lender] = np.arange(is_lender.sum())
    if len(lender_ids):
        ids, sims, stats = neighbors(unit[is_lender], unit, self_index, fb)
        rows = neighbor_rows(user_ids, lender_ids, ids, sims)
    else:  # nobody to borrow from: an empty table, and the neighbor tier serves nothing
        rows, stats = [], {"index": "none", "indexed": 0, "queries": len(user_ids), "recall_at_k": float("nan")}
    df = spark.createDataFrame(rows, "user_id string, rank int, neighbor_id string, similarity float") \
        .withColumn("index_kind", F.lit(stats["index"])) \
        .withColumn("computed_at", F.lit(t).cast("timestamp")) \
        .withColumn("expires_at", F.lit(t + timedelta(hours=fb.neighbor_ttl_hours)).cast("timestamp")) \
        .withColumn("run_id", F.lit(run_id))
    lake.overwrite(cfg, USER_NEIGHBORS, conform(df, USER_NEIGHBORS))
    return {"run_id": run_id, "users_represented": int(len(vecs)), "not_representable": int((~ok).sum()),
            "lenders": int(len(lender_ids)), "users_with_neighbors": len({r[0] for r in rows}),
            "neighbor_rows": len(rows), "index": stats["index"], "recall_at_k": round(stats["recall_at_k"], 4),
            "k": fb.neighbors_k, "seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.user_neighbors", __doc__.split("\n\n")[0], run,
                      lambda c: print_counters("user neighbors", c))


if __name__ == "__main__":
    sys.exit(main())
