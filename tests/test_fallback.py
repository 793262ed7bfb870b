"""Hierarchical fallback on a tiny synthetic lake: user means, FAISS neighbors, publication, as-of
resolution into request_features, the coverage report, and their bad inputs."""

from datetime import datetime, timedelta

import numpy as np
import pytest
from pyspark.sql import functions as F

from feature_store.resolution import TIERS, Snapshot
from spark_jobs import coverage, cycle, publish, resolve_features, user_means, user_neighbors
from tests.conftest import TINY, copy_lake

pytestmark = pytest.mark.spark

T = datetime(2026, 1, 5, 8, 0, 0)  # the synthetic log runs 2026-01-05 00:00 .. 12:00


@pytest.fixture(scope="module")
def lake(spark, lake_root, base_lake):
    """The shared tiny log and models, then hourly cycles at T and T+1h (resolve, precompute, means, neighbors, publish)."""
    from tests.conftest import _test_config

    cfg = _test_config(lake_root / "fallback", database="t_fallback").with_overrides(
        precompute={"lookback_hours": 3, "trending_items": 5, "recent_items_per_user": 5,
                    "budget": 0.3},
        fallback={"neighbors_k": 3, "recall_sample": 50}, models={"device": "cpu"})
    copy_lake(spark, base_lake, cfg)
    sums = {}
    for t in (T, T + timedelta(hours=1)):
        cycle.run(spark, cfg, t, stages=("precompute",), log=lambda *_: None)
        # what this run wrote, before a later run can replace rows of the same pairs
        sums[t] = {r.user_id: (np.sum(np.array(r.e, dtype=np.float64), axis=0), len(r.e)) for r in
                   tbl(spark, cfg, "pair_embeddings").where(F.col("computed_at") == F.lit(t))
                   .groupBy("user_id").agg(F.collect_list("embedding").alias("e")).collect()}
        cycle.run(spark, cfg, t, stages=("user_means", "user_neighbors", "publish"), log=lambda *_: None)
    return cfg, sums


def tbl(spark, cfg, name):
    return spark.table(f"{cfg.lake.database}.{name}")


def rows(spark, cfg, name, drop=()):
    df = tbl(spark, cfg, name)
    return sorted(tuple(r) for r in df.select([c for c in df.columns if c not in drop]).collect())


def test_user_means_average_every_embedding_computed_in_the_window(spark, lake):
    cfg, sums = lake
    t1 = T + timedelta(hours=1)
    got = {r.user_id: r for r in tbl(spark, cfg, "user_mean_embeddings").collect()}
    users = set(sums[T]) | set(sums[t1])
    assert users and users <= set(got)
    for u in users:
        parts = [sums[t][u] for t in (T, t1) if u in sums[t]]
        want = sum(p[0] for p in parts) / sum(p[1] for p in parts)
        np.testing.assert_allclose(got[u].embedding, want, rtol=1e-5, atol=1e-6)
        assert got[u].pair_count == sum(p[1] for p in parts)
        if u in sums[t1]:
            assert (got[u].computed_at, got[u].expires_at) == (t1, t1 + timedelta(hours=6))


def test_neighbors_are_other_lenders_ranked_by_similarity(spark, lake):
    cfg, _ = lake
    t1 = T + timedelta(hours=1)
    nb = tbl(spark, cfg, "user_neighbors").toPandas()
    lenders = {r.user_id for r in tbl(spark, cfg, "user_mean_embeddings")
               .where((F.col("computed_at") <= F.lit(t1)) & (F.col("expires_at") > F.lit(t1))).collect()}
    assert len(nb) and (nb["user_id"] != nb["neighbor_id"]).all()
    assert set(nb["neighbor_id"]) <= lenders
    assert set(nb["index_kind"]) == {"IndexFlatIP"}  # 120 users: under exact_search_max
    for _, g in nb.groupby("user_id"):
        assert list(g.sort_values("rank")["rank"]) == list(range(1, len(g) + 1)) and len(g) <= 3
        assert (np.diff(g.sort_values("rank")["similarity"].to_numpy()) <= 1e-6).all()


def test_as_of_resolution_matches_the_lookup_and_never_reads_the_future(spark, lake):
    cfg, _ = lake
    start, end = T, T + timedelta(hours=2)
    counts = resolve_features.run(spark, cfg, start, end)
    feats = tbl(spark, cfg, "request_features").where((F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(end))).toPandas()
    n_requests = tbl(spark, cfg, "request_log").where((F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(end))).count()
    assert len(feats) == n_requests == counts["candidates"] and set(feats["tier"]) <= set(TIERS)
    assert counts["tier_exact"] > 0 and counts["tier_user_mean"] > 0
    pubs = {p["run_id"]: p for p in publish.published(spark, cfg)}
    # each request read the newest snapshot published at or before it, never a later one
    for run_id, g in feats.groupby("snapshot_run_id"):
        assert (g["ts"] >= pd_ts(pubs[run_id]["interval_end"])).all()
        later = [p for p in pubs.values() if p["interval_end"] > pubs[run_id]["interval_end"]]
        assert all((g["ts"] < pd_ts(p["interval_end"])).all() for p in later)
    # the same requests through the snapshot the online lookup loads give the same answers
    for run_id, g in feats.groupby("snapshot_run_id"):
        p = pubs[run_id]
        snap = Snapshot.load(cfg.lake.tables_path, {k: v for k, v in p.items() if k.endswith("_version")}, TINY.code_dim)
        for (user, ts), r in g.groupby(["user_id", "ts"]):
            emb, tier = snap.lookup(user, r["item_id"].to_numpy(), ts)
            assert [TIERS[x] for x in tier] == list(r["tier"])
            np.testing.assert_array_equal(emb, np.stack(r["embedding"].to_numpy()).astype(np.float32))
    none = feats[feats["tier"] == "none"]
    assert all(not np.any(e) for e in none["embedding"])


def pd_ts(t):
    import pandas as pd

    return pd.Timestamp(t)


def test_coverage_shares_sum_to_one_per_bucket(spark, lake):
    cfg, _ = lake
    start, end = T, T + timedelta(hours=2)
    resolve_features.run(spark, cfg, start, end)
    report = coverage.run(spark, cfg, start, end)
    by = {}
    for activity, tier, pairs, share in report:
        by.setdefault(activity, []).append((tier, pairs, share))
    assert "all" in by and len(by["all"]) == len(TIERS)
    for activity, tiers in by.items():
        assert sum(s for _, _, s in tiers) == pytest.approx(1.0)
    n = tbl(spark, cfg, "request_features").where((F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(end))).count()
    assert sum(p for _, p, _ in by["all"]) == n
    assert "| all |" in coverage.table(report)


def test_rerunning_the_fallback_stages_leaves_the_same_tables(spark, lake):
    cfg, _ = lake
    t1 = T + timedelta(hours=1)
    names = ["user_mean_embeddings", "user_embedding_sums", "user_neighbors"]
    before = {n: rows(spark, cfg, n) for n in names}
    user_means.run(spark, cfg, t1)
    user_neighbors.run(spark, cfg, t1)
    assert {n: rows(spark, cfg, n) for n in names} == before


def neighbor_lists(spark, cfg):
    nb = tbl(spark, cfg, "user_neighbors").toPandas().sort_values(["user_id", "rank"])
    return list(zip(nb["user_id"], nb["rank"], nb["neighbor_id"])), nb["similarity"].to_numpy()


def test_an_incremental_neighbor_build_equals_a_rebuild_and_searches_less(spark, lake, make_cfg):
    base, _ = lake
    cfg = copy_lake(spark, base, make_cfg("incremental_neighbors", models={"root": str(base.models_root), "device": "cpu"},
                                           fallback={"neighbors_k": 3, "recall_sample": 50}), models=False)
    t2 = T + timedelta(hours=2)
    inc = user_neighbors.run(spark, cfg, t2)  # from the state the fixture's build at T+1h left
    assert not inc["rebuilt"] and inc["recall_at_k"] == 1.0
    assert inc["vectors_computed"] < inc["users_represented"]  # an hour later most histories read the same
    assert inc["searched_whole_index"] < inc["users_represented"]
    got, got_sims = neighbor_lists(spark, cfg)

    spark.sql(f"DELETE FROM {cfg.lake.database}.user_vectors")  # no state: everything from scratch
    full = user_neighbors.run(spark, cfg, t2)
    assert full["rebuilt"] and full["vectors_computed"] == full["users_represented"]
    want, want_sims = neighbor_lists(spark, cfg)
    assert got == want
    np.testing.assert_allclose(got_sims, want_sims, atol=1e-5)
    assert (inc["neighbor_rows"], inc["users_with_neighbors"]) == (full["neighbor_rows"], full["users_with_neighbors"])


def test_a_neighbor_table_changed_behind_the_build_is_rebuilt_whole(spark, lake, make_cfg):
    base, _ = lake
    cfg = copy_lake(spark, base, make_cfg("neighbors_behind", models={"root": str(base.models_root), "device": "cpu"},
                                           fallback={"neighbors_k": 3, "recall_sample": 50}), models=False)
    t1 = T + timedelta(hours=1)
    stamps = ("computed_at", "expires_at", "run_id")  # a rebuild stamps every row with its own run
    before = rows(spark, cfg, "user_neighbors", drop=stamps)
    spark.sql(f"DELETE FROM {cfg.lake.database}.user_neighbors WHERE rank = 1")  # the state no longer describes it
    c = user_neighbors.run(spark, cfg, t1)
    assert c["rebuilt"] and c["neighbor_rows"] == len(before) and c["users_rewritten"] == c["users_with_neighbors"]
    assert rows(spark, cfg, "user_neighbors", drop=stamps) == before


def test_user_means_exclude_and_count_bad_embeddings(spark, make_cfg):
    cfg = make_cfg("bad_means")
    from feature_store.tables import PAIR_EMBEDDINGS, ensure_tables

    ensure_tables(spark, cfg, (PAIR_EMBEDDINGS,))
    t = T
    good, same = [1.0, 2.0], [3.0, 3.0]
    spark.createDataFrame(
        [("one", "i1", good, "m"), ("flat", "i1", same, "m"), ("flat", "i2", same, "m"),
         ("nan", "i1", [float("nan"), 1.0], "m"), ("nan", "i2", [2.0, 2.0], "m"), ("short", "i1", [1.0], "m"),
         ("one", "i2", [9.0, 9.0], "another FM")],  # a code of another code space: never averaged in
        "user_id string, item_id string, embedding array<float>, model_version string") \
        .withColumn("computed_at", F.lit(t).cast("timestamp")) \
        .withColumn("expires_at", F.lit(t + timedelta(hours=6)).cast("timestamp")) \
        .withColumn("run_id", F.lit(t.isoformat())) \
        .write.format("delta").mode("append").saveAsTable(f"{cfg.lake.database}.pair_embeddings")
    c = user_means.run(spark, cfg, t, code_versions={"m": 2})
    assert (c["pairs_of_run"], c["excluded_invalid"], c["excluded_other_code_version"], c["users_updated"]) == (7, 2, 1, 3)
    assert {r.code_version for r in tbl(spark, cfg, "user_mean_embeddings").collect()} == {"m"}
    got = {r.user_id: (list(r.embedding), r.pair_count) for r in tbl(spark, cfg, "user_mean_embeddings").collect()}
    assert got == {"one": (good, 1), "flat": (same, 2), "nan": ([2.0, 2.0], 1)}  # one pair; zero variance; NaN dropped
    # in a rollout both code spaces get means, each of its own codes only, one row per user and space
    c = user_means.run(spark, cfg, t, code_versions={"m": 2, "another FM": 2})
    assert (c["excluded_invalid"], c["excluded_other_code_version"], c["users_updated"]) == (2, 0, 4)
    got = {(r.user_id, r.code_version): list(r.embedding) for r in tbl(spark, cfg, "user_mean_embeddings").collect()}
    assert got == {("one", "m"): good, ("flat", "m"): same, ("nan", "m"): [2.0, 2.0], ("one", "another FM"): [9.0, 9.0]}


def test_neighbors_with_nobody_to_borrow_from_or_k_above_the_user_count():
    from include.config import FallbackConfig
    from model.knn import neighbors, normalize

    vecs, ok = normalize(np.array([[1, 0], [1, 0], [0, 1], [0, 0]], np.float32))  # two identical, one zero
    assert list(ok) == [True, True, True, False]
    ids, sims, stats = neighbors(vecs[:3], vecs[:3], np.arange(3), FallbackConfig(neighbors_k=10, recall_sample=3))
    assert ids.shape[1] <= 10 and stats["recall_at_k"] == 1.0
    for q in range(3):
        found = [i for i in ids[q] if i >= 0]
        assert sorted(found) == sorted(set(range(3)) - {q})  # k > users: every other user, never itself
    assert sims[0][list(ids[0]).index(1)] == pytest.approx(1.0)  # identical vectors: similarity 1


def test_an_empty_neighbor_build_serves_no_neighbor_tier(spark, make_cfg, lake):
    base, _ = lake
    cfg = make_cfg("empty_neighbors", models={"root": str(base.models_root), "device": "cpu"})
    c = user_neighbors.run(spark, cfg, T)  # no user means at all in this lake: nobody can lend
    assert (c["lenders"], c["neighbor_rows"]) == (0, 0)
    assert tbl(spark, cfg, "user_neighbors").count() == 0
    snap = Snapshot.load(cfg.lake.tables_path, dim=TINY.code_dim)
    _, tier = snap.lookup("u1", ["i1"], T)
    assert [TIERS[x] for x in tier] == ["none"]


def test_resolution_rejects_an_empty_interval(spark, lake):
    cfg, _ = lake
    with pytest.raises(ValueError, match="empty interval"):
        resolve_features.run(spark, cfg, T, T)


def test_the_http_lookup_serves_what_the_batch_job_logged(spark, lake):
    """The equivalence of the two readers through the real service: requests served by the newest
    snapshot, replayed against the HTTP lookup at their own timestamps, get the logged tiers and
    embeddings exactly."""
    import threading

    from lookup.client import LookupClient
    from lookup.online import OnlineStore
    from lookup.server import LookupServer

    cfg, _ = lake
    start, end = T + timedelta(hours=1), T + timedelta(hours=2)
    resolve_features.run(spark, cfg, start, end)
    newest = max(publish.published(spark, cfg), key=lambda p: p["interval_end"])["run_id"]
    feats = (tbl(spark, cfg, "request_features").where((F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(end)))
             .where(F.col("snapshot_run_id") == newest).toPandas())
    assert len(feats)
    store = OnlineStore(cfg.lake.tables_path, poll_seconds=60, record_misses=False).start()
    srv = LookupServer(store, "127.0.0.1", 0, allow_client_now=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with LookupClient(srv.url) as c:
            for (user, ts), r in feats.groupby(["user_id", "ts"]):
                emb, tiers, snapshot = c.lookup(user, list(r["item_id"]), ts.to_pydatetime().replace(tzinfo=None))
                assert snapshot == newest and tiers == list(r["tier"])
                np.testing.assert_array_equal(emb, np.stack(r["embedding"].to_numpy()).astype(np.float32))
    finally:
        srv.shutdown()
        srv.server_close()
        store.stop()


def test_coverage_sweep_replays_each_setting_in_its_own_lake(spark, lake):
    """Two budgets through the real cycle: each setting's tables live apart, the base lake's inputs
    are only read, a larger budget covers at least as much exactly, and a rerun replaces its rows."""
    from delta.tables import DeltaTable

    from experiments import coverage_sweep as sweep

    cfg, _ = lake
    versions = {n: DeltaTable.forName(spark, f"{cfg.lake.database}.{n}").history(1).first()["version"]
                for n in ("request_log", "user_events", "pair_embeddings")}
    ends, measure_from = [T, T + timedelta(hours=1)], T
    low, high = sweep.SweepPoint(0.1, 6.0), sweep.SweepPoint(0.6, 6.0)
    got = {}
    for p in (low, high):
        rows = sweep.replay(spark, cfg, p, ends, measure_from, log=lambda *_: None)
        sweep.save(spark, cfg, rows)
        got[p] = {r["tier"]: r for r in rows}
        assert set(got[p]) == set(TIERS) and sum(r["share"] for r in rows) == pytest.approx(1.0)
        pcfg = sweep.point_config(cfg, p)
        assert (pcfg.lake.table_path("pair_embeddings") / "_delta_log").is_dir()
        assert str(pcfg.lake.root_path).startswith(str(cfg.lake.root_path / "sweeps"))
    # same requests served in both settings; more budget, more FM work and at least the same exact share
    assert sum(got[low][t]["pairs"] for t in TIERS) == sum(r["pairs"] for r in got[high].values()) > 0
    assert got[high]["exact"]["fm_inferences"] > got[low]["exact"]["fm_inferences"] > 0
    assert got[high]["exact"]["share"] >= got[low]["exact"]["share"]
    # the base lake was only read
    assert versions == {n: DeltaTable.forName(spark, f"{cfg.lake.database}.{n}").history(1).first()["version"]
                        for n in versions}
    # a rerun of a setting replaces its rows, and the table prints one line per setting
    sweep.save(spark, cfg, list(got[low].values()))
    saved = tbl(spark, cfg, "coverage_sweep").toPandas()
    assert len(saved) == 2 * len(TIERS) and set(saved["point"]) == {low.name, high.name}
    text = sweep.table(saved.to_dict("records"))
    assert "| 2026-01-05 08:00..09:00 | 10% | 6 h |" in text and "| 2026-01-05 08:00..09:00 | 60% | 6 h |" in text
    # a setting whose folder was deleted starts anew instead of reading tables that are gone
    import shutil

    pcfg = sweep.point_config(cfg, low)
    shutil.rmtree(pcfg.lake.root_path)
    sweep.register_inputs(spark, cfg, pcfg)
    assert not spark.catalog.tableExists(f"{pcfg.lake.database}.pair_embeddings")
    assert spark.table(f"{pcfg.lake.database}.request_log").count() == tbl(spark, cfg, "request_log").count()


def test_coverage_sweep_settings_and_bad_arguments(tmp_path):
    from experiments import coverage_sweep as sweep

    cross = sweep.sweep_points([0.05, 0.2], [1, 6, 24], 0.2, 6, "cross")
    assert [p.name for p in cross] == ["budget0.05_ttl6h", "budget0.2_ttl6h", "budget0.2_ttl1h", "budget0.2_ttl24h"]
    assert len(sweep.sweep_points([0.05, 0.2], [1, 6], 0.2, 6, "full")) == 4
    with pytest.raises(ValueError, match="budget"):
        sweep.SweepPoint(0, 6)
    with pytest.raises(ValueError, match="TTL"):
        sweep.SweepPoint(0.2, -1)
    with pytest.raises(ValueError, match="grid"):
        sweep.sweep_points([0.2], [6], 0.2, 6, "diagonal")
    with pytest.raises(SystemExit):
        sweep.main(["--start", "2026-01-05T08:00:00", "--end", "2026-01-05T06:00:00", "--measure-from", "2026-01-05T07:00:00"])
    with pytest.raises(SystemExit):
        sweep.main(["--start", "x", "--end", "y", "--measure-from", "z", "--budgets", "a,b"])
    with pytest.raises(SystemExit):
        sweep.main(["--start", "2026-01-05T08:00:00"])  # the interval is incomplete and --report not asked


def test_coverage_sweep_needs_an_ingested_base_lake(spark, make_cfg):
    from experiments import coverage_sweep as sweep

    cfg = make_cfg("sweep_no_inputs")
    with pytest.raises(FileNotFoundError, match="ingest a log"):
        sweep.register_inputs(spark, cfg, sweep.point_config(cfg, sweep.SweepPoint(0.2, 6)))


def test_a_lookup_started_before_the_first_job_leaves_miss_queue_to_the_jobs(spark, make_cfg):
    """On an empty lake (a lookup started before any Spark job), the lookup's misses wait in its
    buffer instead of creating miss_queue; the job then creates the table from its declaration and
    the next flush lands in it."""
    from lookup.online import OnlineStore
    from feature_store.tables import MISS_QUEUE, ensure_table

    cfg = make_cfg()
    store = OnlineStore(cfg.lake.tables_path, dim=4, poll_seconds=60, miss_flush_seconds=60)
    store.poll_once()
    _, tiers, _ = store.lookup("u1", ["i1", "i2"], T)
    assert list(tiers) == [3, 3] and store.misses.flush() == 0 and store.misses.status()["buffered"] == 2
    assert not cfg.lake.table_path("miss_queue").exists()
    ensure_table(spark, MISS_QUEUE, cfg)  # the first job: no schema mismatch with anything the lookup wrote
    assert store.misses.flush() == 2
    rows = tbl(spark, cfg, "miss_queue").collect()
    assert sorted((r.user_id, r.item_id, r.origin) for r in rows) == [("u1", "i1", "lookup"), ("u1", "i2", "lookup")]
    store.stop()
