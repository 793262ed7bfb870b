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
against exact search measured on the final lists and printed.

A build is incremental. Its state, ``user_vectors``, keeps each user's vector, a key of the
inputs it came from and the user's exact top lenders to twice k. The next build:
- runs the FM only on users whose inputs changed (an event, an event aged into the next recency
  code or out of the horizon, a new user);
- searches the whole index only for those users and for users whose list lost more lenders than
  it can spare; everyone else searches only the lenders that joined or moved, merged into the
  list they had (``model.knn.update_neighbors``: exact, not an approximation);
- MERGEs ``user_neighbors``: the rows of users whose list changed, rows past half their TTL
  renewed, the users no longer represented deleted.
Another FM version, or state that does not describe the table's latest version (a build stopped
between its two writes), rebuilds everything and replaces the table. A rerun at the same t
changes nothing.

    python -m spark_jobs.user_neighbors --at 2026-01-05T12:00:00 [--config F]   (after user_means)
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_store.tables import (ITEMS, REQUEST_LOG, USER_EVENTS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS, USER_VECTORS,
                                  conform, ensure_tables, in_time_range, qualified_name)
from feature_store import lake
from include.cli import print_counters, run_at_time
from model.interface import BUILTIN_FM
from model.knn import Candidates, ranks
from spark_jobs import embed_pairs
from spark_jobs.embed_pairs import fm_device


DEPTH_PER_K = 2  # lists kept to 2k lenders: a user searches the whole index again after losing k of them


def user_vectors(users: DataFrame, fm_path: str, ae_path: str, t: datetime, device: str = "cpu",
                 allowed: frozenset[str] = frozenset({BUILTIN_FM}), task_gpus: float = 0.0) -> DataFrame:
    """(user_id, inputs_key, vector, fresh): the FM user-only pass as of t of rows with user_id, the
    history columns of ``embed_pairs.histories`` and the previous build's ``known_key`` and
    ``known_vector`` (null where none), which a row whose inputs did not change reuses
    (``model.inference.fm_user_vectors``). ``task_gpus``: as ``embed_pairs.embed``."""

    def run(batches):
        import pandas as pd

        from model.inference import fm_user_vectors

        on = embed_pairs.task_device(device)
        for pdf in batches:
            v, keys, fresh = fm_user_vectors(pdf.assign(ts=pd.Timestamp(t)), fm_path, ae_path, device=on,
                                             allowed=allowed, known_keys=pdf["known_key"],
                                             known_vectors=pdf["known_vector"])
            yield pd.DataFrame({"user_id": pdf["user_id"], "inputs_key": keys, "vector": list(v), "fresh": fresh})

    return users.mapInPandas(run, "user_id string, inputs_key long, vector array<float>, fresh boolean",
                             profile=embed_pairs.gpu_profile(task_gpus) if task_gpus else None)


def previous_lists(got: pd.DataFrame, user_ids: np.ndarray) -> Candidates:
    """The previous build's lists (``candidates``, ``candidate_similarity``, ``candidates_complete``
    columns, null for users it did not list) in this build's rows; a lender no longer represented
    maps to -1."""
    n = len(got)
    sizes = got["candidates"].map(lambda c: 0 if c is None else len(c)).to_numpy(np.int64)
    has = sizes > 0
    flat_ids = np.concatenate([np.asarray(c, dtype=object) for c in got["candidates"][has]]) if has.any() else \
        np.zeros(0, object)
    flat_sims = np.concatenate([np.asarray(c, np.float32) for c in got["candidate_similarity"][has]]) if has.any() \
        else np.zeros(0, np.float32)
    return Candidates(np.repeat(np.arange(n), sizes), pd.Index(user_ids).get_indexer(flat_ids).astype(np.int64),
                      flat_sims, got["candidates_complete"].fillna(False).to_numpy(bool))


def changed_rows(new: pd.DataFrame, old: pd.DataFrame, renew: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows to write, (user_id, rank) rows to delete) that turn the table's lists ``old`` into
    ``new`` (both user_id, rank, neighbor_id, similarity): a user's rows are written where its list
    differs in any lender or similarity, or where the user is in ``renew`` (its rows need a later
    expiry); ranks past a user's new list go."""
    cols = ["user_id", "rank", "neighbor_id", "similarity"]
    both = new[cols].merge(old[cols], on=["user_id", "rank"], how="outer", suffixes=("", "_old"), indicator=True)
    differs = (both["_merge"] != "both") | (both["neighbor_id"] != both["neighbor_id_old"]) | \
        (both["similarity"] != both["similarity_old"])
    changed_users = set(both.loc[differs, "user_id"]) | set(renew)
    write = new[new["user_id"].isin(changed_users)]
    delete = both.loc[both["_merge"] == "right_only", ["user_id", "rank"]]
    return write, delete


def run(spark, cfg, t: datetime) -> dict:
    from model import interface, registry
    from model.knn import normalize, update_neighbors
    from model.registry import resolve_models

    started = laps_from = time.perf_counter()
    laps = {}

    def lap(name: str) -> None:  # where the time went, printed with the counters
        nonlocal laps_from
        now_s = time.perf_counter()
        laps[name], laps_from = round(now_s - laps_from, 1), now_s

    fb, db = cfg.fallback, cfg.lake.database
    run_id = lake.run_id(t)
    ensure_tables(spark, cfg, (REQUEST_LOG, USER_EVENTS, ITEMS, USER_MEAN_EMBEDDINGS, USER_NEIGHBORS, USER_VECTORS))
    models = resolve_models(cfg)
    fm_cfg = registry.read_json(models["fm"], "config.json")["config"]
    fm_cls = interface.fm_class(registry.stored_class(models["fm"]), cfg.allowed_classes)  # refused here if not allowed
    model_version = f"{models['fm']}@{registry.weights_digest(models['fm'])[:16]}"
    k, depth = fb.neighbors_k, DEPTH_PER_K * fb.neighbors_k
    table_version = lake.latest_version(spark, cfg, USER_NEIGHBORS)
    # State of a build of this FM that describes the table as it is; anything else is no state.
    state = (spark.table(qualified_name(USER_VECTORS, db))
             .where((F.col("model_version") == model_version) & (F.col("neighbors_version") == table_version)
                    & (F.col("k") == k)))
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
    known = state.select("user_id", F.col("inputs_key").alias("known_key"), F.col("vector").alias("known_vector"))
    device, task_gpus = fm_device(cfg)
    vecs = user_vectors(active.join(known, "user_id", "left"), models["fm"], models["autoencoder"], t, device,
                        cfg.allowed_classes, task_gpus)
    got = vecs.join(state.select("user_id", F.col("lender").alias("was_lender"), "candidates", "candidate_similarity",
                                 "candidates_complete", "listed_at"), "user_id", "left").toPandas()
    old_lists = state.select("user_id", "candidates", "candidate_similarity", "listed_at").toPandas()
    lender_set = {r.user_id for r in lenders.collect()}
    lap("vectors+collect")

    computed = int(got["fresh"].sum())
    unit, ok = normalize(np.stack(got["vector"].to_numpy()) if len(got) else np.zeros((0, 1), np.float32))
    got, unit = got[ok].reset_index(drop=True), unit[ok]
    user_ids = got["user_id"].to_numpy(dtype=object)
    is_lender = np.fromiter((u in lender_set for u in user_ids), bool, len(user_ids))
    out, stats = update_neighbors(unit, is_lender, got["fresh"].to_numpy(bool), got["was_lender"].fillna(False).to_numpy(bool),
                                  previous_lists(got, user_ids), np.argsort(np.argsort(user_ids)), fb, depth)
    lap("search")
    now = pd.Timestamp(lake.as_utc(t)).tz_localize(None)
    stamp = {"index_kind": stats["index"], "computed_at": now, "expires_at": now + timedelta(hours=fb.neighbor_ttl_hours),
             "run_id": run_id}
    rebuild = len(old_lists) == 0  # no state to diff against (then every user was fresh: none had a known key)
    top, written, deleted = write_lists(spark, cfg, user_ids, out, old_lists, stamp, rebuild)
    lap("write neighbors")

    # The state: what the next build diffs against, stamped with the table version it describes.
    listed_at = dict(zip(old_lists["user_id"], pd.to_datetime(old_lists["listed_at"])))
    per_user = (lambda v: np.split(v, np.searchsorted(out.user, np.arange(1, len(user_ids))))) if len(user_ids) \
        else (lambda v: [])  # noqa: E731
    state_rows = pd.DataFrame({
        "user_id": user_ids, "inputs_key": got["inputs_key"].to_numpy(np.int64), "vector": got["vector"],
        "lender": is_lender, "candidates": per_user(user_ids[out.lender]),
        "candidate_similarity": per_user(out.similarity), "candidates_complete": out.complete,
        "listed_at": [now if (u in written or u not in listed_at) else listed_at[u] for u in user_ids],
        "model_version": model_version, "k": k, "neighbors_version": lake.latest_version(spark, cfg, USER_NEIGHBORS),
        "computed_at": now, "run_id": run_id})
    lake.overwrite(cfg, USER_VECTORS, conform(_frame(spark, state_rows, USER_VECTORS), USER_VECTORS))
    lap("write state")
    return {"run_id": run_id, "users_represented": int(len(got) + (~ok).sum()), "not_representable": int((~ok).sum()),
            "vectors_computed": computed, "lenders": int(is_lender.sum()),
            "users_with_neighbors": int(top["user_id"].nunique()), "neighbor_rows": int(len(top)),
            "joined_lenders": stats["joined_lenders"], "searched_whole_index": stats["searched_whole_index"],
            "searched_joined_only": stats["searched_joined_only"],
            "users_rewritten": len(written), "rows_deleted": deleted, "rebuilt": bool(rebuild),
            "index": stats["index"], "recall_at_k": round(stats["recall_at_k"], 4), "k": k,
            "seconds": round(time.perf_counter() - started, 2),
            "stage_seconds": ", ".join(f"{k} {v}" for k, v in laps.items())}


def write_lists(spark, cfg, user_ids: np.ndarray, out: Candidates, old_lists: pd.DataFrame, stamp: dict,
                rebuild: bool) -> tuple[pd.DataFrame, set, int]:
    """Bring ``user_neighbors`` to each user's first k of ``out``: replaced whole on a ``rebuild``,
    else one MERGE of the changes against the lists the state says the table holds (``old_lists``),
    renewing rows past half their TTL. Returns (every list's rows now, the users whose rows were
    written, how many rows were deleted)."""
    k = cfg.fallback.neighbors_k
    rank = ranks(out.user)
    first = rank < k
    top = pd.DataFrame({"user_id": user_ids[out.user[first]], "rank": rank[first] + 1,
                        "neighbor_id": user_ids[out.lender[first]], "similarity": out.similarity[first]})
    if rebuild:
        write, delete = top, top.iloc[:0][["user_id", "rank"]]
        lake.overwrite(cfg, USER_NEIGHBORS, conform(_frame(spark, top.assign(**stamp)), USER_NEIGHBORS))
    else:
        now, ttl = stamp["computed_at"], stamp["expires_at"] - stamp["computed_at"]
        listed = pd.to_datetime(old_lists["listed_at"])
        renew = old_lists["user_id"][(listed > now) | (now - listed >= ttl / 2)]
        write, delete = changed_rows(top, _explode(old_lists, k), renew.to_numpy())
        if len(write) or len(delete):
            changes = pd.concat([write.assign(**stamp, _delete=False), delete.assign(_delete=True)], ignore_index=True)
            lake.merge_changes(spark, cfg, USER_NEIGHBORS, _frame(spark, changes, with_delete=True))
    return top, set(write["user_id"]), len(delete)


def _explode(lists: pd.DataFrame, k: int) -> pd.DataFrame:
    """(user_id, rank, neighbor_id, similarity) of the first k candidates of each state row."""
    sizes = lists["candidates"].map(len).clip(upper=k).to_numpy(np.int64)
    users = np.repeat(lists["user_id"].to_numpy(dtype=object), sizes)
    rank = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    ids = [x for c, n in zip(lists["candidates"], sizes) for x in list(c)[:n]]
    sims = [float(x) for c, n in zip(lists["candidate_similarity"], sizes) for x in list(c)[:n]]
    return pd.DataFrame({"user_id": users, "rank": rank + 1, "neighbor_id": np.asarray(ids, dtype=object),
                         "similarity": np.asarray(sims, np.float32)})


def _frame(spark, pdf: pd.DataFrame, spec=USER_NEIGHBORS, with_delete: bool = False) -> DataFrame:
    """A Spark frame of ``pdf`` with ``spec``'s schema (and a ``_delete`` flag), through Arrow."""
    schema = spec.schema()
    if with_delete:
        from pyspark.sql.types import BooleanType, StructField

        schema = schema.add(StructField("_delete", BooleanType()))
    pdf = pdf.reindex(columns=[f.name for f in schema.fields])
    for c in pdf.columns:  # pandas' Arrow-backed strings reach Spark's Arrow path as chunked arrays it refuses
        if pd.api.types.is_string_dtype(pdf[c]) and pdf[c].dtype != object:
            pdf[c] = pdf[c].astype(object)
    return spark.createDataFrame(pdf, schema)


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.user_neighbors", __doc__.split("\n\n")[0], run,
                      lambda c: print_counters("user neighbors", c))


if __name__ == "__main__":
    sys.exit(main())
