"""The speculative precompute run: selection, embeddings with TTL, miss queue, expiry, idempotency,
bad input, a run killed midway."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import functions as F

from include.cli import parse_time
from include.config import PrecomputeConfig
from model import registry
from spark_jobs import backfill, embed_pairs, miss_queue, precompute, speculate
from tests.conftest import TINY, StandaloneCluster, copy_lake

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]
T = datetime(2026, 1, 5, 9, 0, 0)  # the synthetic log runs 2026-01-05 00:00 .. 12:00


@pytest.fixture(scope="module")
def lake(spark, lake_root, base_lake):
    """The shared tiny synthetic log and tiny models, copied into this module's own lake folder."""
    from tests.conftest import _test_config

    cfg = _test_config(lake_root / "precompute", database="t_precompute")
    cfg = cfg.with_overrides(precompute={"lookback_hours": 3, "trending_items": 5, "recent_items_per_user": 5},
                             models={"device": "cpu"})
    return copy_lake(spark, base_lake, cfg)


def tbl(spark, cfg, name):
    return spark.table(f"{cfg.lake.database}.{name}")


def snapshot(spark, cfg, name, drop=()):
    df = tbl(spark, cfg, name)
    cols = [c for c in df.columns if c not in drop]
    return sorted(tuple(r) for r in df.select(cols).collect())


def test_run_selects_the_budget_and_writes_expiring_embeddings(spark, lake):
    c = precompute.run(spark, lake, T)
    assert c.pairs_scored > 0 and c.pairs_embedded == c.pairs_selected
    assert c.pairs_selected == pytest.approx(0.2 * c.pairs_scored, rel=0.1)
    rows = tbl(spark, lake, "pair_embeddings").where(F.col("run_id") == c.run_id).collect()
    assert len(rows) == c.pairs_embedded
    assert {(r.computed_at, r.expires_at) for r in rows} == {(T, T + timedelta(hours=6))}
    assert {len(r.embedding) for r in rows} == {TINY.code_dim}
    assert all(np.isfinite(r.embedding).all() for r in rows)
    audit = tbl(spark, lake, "verifier_scores").where(F.col("run_id") == c.run_id)
    assert audit.count() == c.pairs_scored
    # every selected pair outscored every speculated pair left out (global selection)
    sel = audit.where("selected AND origin = 'speculated'").agg(F.min("score")).first()[0]
    rest = audit.where("NOT selected AND origin = 'speculated'").agg(F.max("score")).first()[0]
    assert sel >= rest
    saved = tbl(spark, lake, "precompute_runs").where(F.col("run_id") == c.run_id).first()
    assert (saved.pairs_selected, saved.pairs_embedded) == (c.pairs_selected, c.pairs_embedded)


def test_rerunning_an_interval_leaves_the_same_tables(spark, lake):
    t = T + timedelta(hours=3)  # an interval no other test runs: the first run and its rerun are compared
    precompute.run(spark, lake, T)
    first = precompute.run(spark, lake, t)
    names = ["pair_embeddings", "verifier_scores", "miss_queue"]
    before = {n: snapshot(spark, lake, n) for n in names}
    runs_before = snapshot(spark, lake, "precompute_runs", drop=("seconds",))
    again = precompute.run(spark, lake, t)
    assert (again.pairs_selected, again.already_fresh) == (first.pairs_selected, first.already_fresh)
    assert {n: snapshot(spark, lake, n) for n in names} == before
    assert snapshot(spark, lake, "precompute_runs", drop=("seconds",)) == runs_before


def test_next_run_skips_fresh_pairs_and_takes_in_the_miss_queue(spark, lake):
    precompute.run(spark, lake, T)
    t2 = T + timedelta(hours=1)
    user = tbl(spark, lake, "request_log").where(F.col("ts") < F.lit(t2)).orderBy(F.col("ts").desc()).first().user_id
    misses = spark.createDataFrame([(user, "i_never_shown", t2 - timedelta(minutes=5), "lookup", None),
                                    ("u_cold", "i1", t2 - timedelta(minutes=4), "lookup", None),
                                    (user, "i2", t2 + timedelta(minutes=5), "lookup", None)],  # after t2: next run's
                                   "user_id string, item_id string, requested_at timestamp, origin string, consumed_by_run string")
    misses.write.format("delta").mode("append").saveAsTable(f"{lake.lake.database}.miss_queue")
    c = precompute.run(spark, lake, t2)
    assert c.already_fresh > 0  # pairs embedded at T stay fresh until T+6h > t2 + 1h margin
    assert c.queue_in == 2
    emb = {(r.user_id, r.item_id) for r in tbl(spark, lake, "pair_embeddings").where(F.col("run_id") == c.run_id).collect()}
    assert (user, "i_never_shown") in emb and ("u_cold", "i1") in emb  # queued pairs are always computed
    q = {(r.user_id, r.item_id): r.consumed_by_run
         for r in miss_queue.with_consumption(spark, lake.lake.database).collect()}
    assert q[(user, "i_never_shown")] == q[("u_cold", "i1")] == c.run_id
    assert q[(user, "i2")] is None and c.queue_waiting >= 1
    # miss_queue itself is never rewritten: consumption is recorded beside it
    assert tbl(spark, lake, "miss_queue").where(F.col("consumed_by_run").isNotNull()).count() == 0
    again = precompute.run(spark, lake, t2)  # a rerun takes in the same queue and records the same
    assert again.queue_in == 2 and {(r.user_id, r.item_id): r.consumed_by_run for r in
                                    miss_queue.with_consumption(spark, lake.lake.database).collect()} == q


def test_a_lookup_flushing_misses_during_a_run_never_fails_it(spark, lake_root, base_lake):
    """The lookup appends to miss_queue every few seconds; precompute, running at the same time,
    still finishes, records its counters, takes in the queue (its consumption once conflicted
    with every append that landed during the run) and prunes the rows past the retention."""
    import threading

    from lookup.online import MissRecorder
    from feature_store.tables import MISS_QUEUE, ensure_tables

    from tests.conftest import _test_config

    lake = copy_lake(spark, base_lake, _test_config(lake_root / "precompute_race", database="t_precompute_race")
                     .with_overrides(precompute={"lookback_hours": 3, "trending_items": 5, "recent_items_per_user": 5},
                                     models={"device": "cpu"}))
    ensure_tables(spark, lake, (MISS_QUEUE,))  # the flusher never creates it
    t3 = T + timedelta(hours=2)
    recorder = MissRecorder(lake.lake.tables_path, flush_seconds=0.05)
    recorder.add("u_old", [f"i_old{n}" for n in range(7)], t3 - timedelta(hours=30))  # past the 24 h retention
    assert recorder.flush() == 7
    recorder.start()
    stop = threading.Event()

    def traffic():
        n = 0
        while not stop.is_set():
            recorder.add("u_busy", [f"i_busy{n}"], t3 - timedelta(minutes=30))
            n += 1
            time.sleep(0.02)

    feeder = threading.Thread(target=traffic, daemon=True)
    feeder.start()
    try:
        c = precompute.run(spark, lake, t3)
    finally:
        stop.set()
        feeder.join(5)
        recorder.stop()
    assert recorder.flushed > 20 and recorder.flush_errors == 0  # appends kept landing during the run
    runs = tbl(spark, lake, "precompute_runs").where(F.col("run_id") == c.run_id).count()
    assert runs == 1 and c.queue_in > 0
    taken = {r.consumed_by_run for r in miss_queue.with_consumption(spark, lake.lake.database)
             .where(F.col("user_id") == "u_busy").collect()}
    assert c.run_id in taken
    # the old rows were pruned while the appends went on (they are blind appends, which a DELETE
    # commits beside), and every row the flusher wrote is still there
    assert c.queue_pruned == 7
    queue = tbl(spark, lake, "miss_queue")
    assert queue.where(F.col("user_id") == "u_old").count() == 0
    assert queue.where(F.col("user_id") == "u_busy").count() == recorder.flushed - 7


def test_expired_rows_are_removed_and_never_counted_fresh(spark, lake):
    precompute.run(spark, lake, T)
    late = T + timedelta(hours=6, minutes=30)  # the T rows expired 30 minutes ago
    c = precompute.run(spark, lake, late)
    assert c.expired_removed > 0
    assert tbl(spark, lake, "pair_embeddings").where(F.col("expires_at") <= F.lit(late)).count() == 0


def test_an_interval_with_no_traffic_is_an_empty_run_not_an_error(spark, lake):
    # weeks before the log starts; at 01:00, off the 24-hour VACUUM cadence, which the vacuum test covers
    c = precompute.run(spark, lake, datetime(2025, 12, 1, 1))
    assert (c.pairs_scored, c.pairs_selected, c.pairs_embedded) == (0, 0, 0)
    assert tbl(spark, lake, "precompute_runs").where(F.col("run_id") == c.run_id).count() == 1


def test_selection_per_user_and_bad_parameters(spark):
    p = PrecomputeConfig(lookback_hours=3, recent_items_per_user=5, trending_items=5, budget=0.5,
                         selection="per_user", fresh_margin_minutes=60)
    scored = spark.createDataFrame(
        [("a", f"i{k}", "speculated", None, None, float(k)) for k in range(4)] + [("b", "i9", "speculated", None, None, 0.1)],
        "user_id string, item_id string, origin string, device string, surface string, score double")
    fresh = spark.createDataFrame([("a", "i3", T + timedelta(hours=5))], "user_id string, item_id string, expires_at timestamp")
    out = {(r.user_id, r.item_id): r.selected for r in speculate.select(scored, fresh, p, T).collect()}
    # per user top half: a -> i3, i2 (i3 is fresh past t + margin, so skipped); b -> its only pair
    assert out == {("a", "i3"): False, ("a", "i2"): True, ("a", "i1"): False, ("a", "i0"): False, ("b", "i9"): True}
    nan = scored.withColumn("score", F.lit(float("nan")))
    with pytest.raises(ValueError, match="NaN scores"):
        speculate.select(nan, fresh, p, T)
    for bad in (dict(budget=0), dict(budget=1.5), dict(selection="random"), dict(lookback_hours=0),
                dict(queue_per_user=-1)):
        with pytest.raises(ValueError):
            replace(p, **bad)


def test_a_global_budget_holds_when_many_pairs_tie_at_the_threshold(spark):
    """A verifier that gives most pairs one score (unknown ids on a sparse log) must not pull the
    whole tie into the budget: the tie shares the room left above it, the same pairs on every run."""
    p = PrecomputeConfig(lookback_hours=3, recent_items_per_user=5, trending_items=5, budget=0.2,
                         selection="global", fresh_margin_minutes=60)
    rows = [(f"u{k % 97}", f"i{k}", "speculated", None, None, 0.5) for k in range(2000)]  # one tie of 2,000
    rows += [(f"u{k}", f"top{k}", "speculated", None, None, 0.9 + k / 1e4) for k in range(100)]
    rows += [(f"u{k}", f"low{k}", "speculated", None, None, 0.1) for k in range(400)]
    scored = spark.createDataFrame(rows, "user_id string, item_id string, origin string, device string, "
                                         "surface string, score double").repartition(3)
    fresh = spark.createDataFrame([], "user_id string, item_id string, expires_at timestamp")
    picked = {(r.item_id, r.score) for r in speculate.select(scored, fresh, p, T).where("selected").collect()}
    # 20% of 2,500 pairs: the 100 above the tie, and 400 of the tie (sampled by a hash of the pair)
    assert {i for i, s in picked if s > 0.5} == {f"top{k}" for k in range(100)}
    assert not any(s < 0.5 for _, s in picked)
    assert 0.2 * 2500 * 0.9 <= len(picked) <= 0.2 * 2500 * 1.1, len(picked)
    again = {(r.item_id, r.score) for r in speculate.select(scored.repartition(7), fresh, p, T).where("selected").collect()}
    assert again == picked


def test_candidates_are_users_by_recent_and_trending_items(spark):
    p = PrecomputeConfig(lookback_hours=3, recent_items_per_user=1, trending_items=1, budget=0.2,
                         selection="global", fresh_margin_minutes=60)
    reqs = spark.createDataFrame([
        ("r1", "a", "x", T - timedelta(hours=1), 1, "d", "s"), ("r1", "a", "y", T - timedelta(hours=1), 0, "d", "s"),
        ("r2", "b", "z", T - timedelta(minutes=30), 0, "d2", "s"), ("r3", "a", "w", T - timedelta(minutes=10), 0, "d3", "s")],
        "request_id string, user_id string, item_id string, ts timestamp, label int, device string, surface string")
    misses = spark.createDataFrame([("c", "q", T - timedelta(minutes=5))], "user_id string, item_id string, requested_at timestamp")
    got = {(r.user_id, r.item_id, r.origin, r.device) for r in speculate.candidates(reqs, misses, p).collect()}
    # recent: a's latest item (w), b's (z); trending: x (the only click); queued: (c, q), cold context
    assert got == {("a", "w", "speculated", "d3"), ("a", "x", "speculated", "d3"), ("b", "z", "speculated", "d2"),
                   ("b", "x", "speculated", "d2"), ("c", "q", "miss_queue", None)}


def test_queued_misses_are_bounded_per_user_and_per_run(spark):
    """A flood of misses from one user (or from everyone) cannot take over a run: at most
    queue_per_user of a user, the most recently requested, and queue_max_pairs in all."""
    p = PrecomputeConfig(lookback_hours=3, recent_items_per_user=1, trending_items=1, queue_per_user=3,
                         queue_max_pairs=5)
    reqs = spark.createDataFrame([("r1", "a", "x", T - timedelta(hours=1), 1, "d", "s")],
                                 "request_id string, user_id string, item_id string, ts timestamp, label int, device string, surface string")
    flood = [("f", f"i{k:03d}", T - timedelta(seconds=k)) for k in range(200)] + [("g", "j1", T - timedelta(hours=2)),
                                                                               ("h", "j2", T - timedelta(hours=3))]
    misses = spark.createDataFrame(flood, "user_id string, item_id string, requested_at timestamp")
    got = sorted((r.user_id, r.item_id) for r in speculate.candidates(reqs, misses, p).collect() if r.origin == "miss_queue")
    assert got == [("f", "i000"), ("f", "i001"), ("f", "i002"), ("g", "j1"), ("h", "j2")]
    tight = replace(p, queue_max_pairs=4)
    got = sorted((r.user_id, r.item_id) for r in speculate.candidates(reqs, misses, tight).collect() if r.origin == "miss_queue")
    assert got == [("f", "i000"), ("f", "i001"), ("f", "i002"), ("g", "j1")]  # the oldest waits


def test_misses_of_users_with_traffic_go_first(spark):
    """450 invented users flood the queue with fresh misses; the one real user (with requests in the
    window) missed earlier. The run takes the real user's misses before any invented one."""
    p = PrecomputeConfig(lookback_hours=3, recent_items_per_user=1, trending_items=1, queue_per_user=50,
                         queue_max_pairs=100)
    reqs = spark.createDataFrame([("r1", "real", "x", T - timedelta(hours=1), 1, "d", "s")],
                                 "request_id string, user_id string, item_id string, ts timestamp, label int, device string, surface string")
    fake = [(f"fake{u}", f"i{k}", T - timedelta(seconds=u + k)) for u in range(450) for k in range(50)]
    real = [("real", f"r{k}", T - timedelta(hours=2, seconds=k)) for k in range(50)]
    misses = spark.createDataFrame(fake + real, "user_id string, item_id string, requested_at timestamp")
    got = [r for r in speculate.candidates(reqs, misses, p).collect() if r.origin == "miss_queue"]
    assert len(got) == 100 and sum(r.user_id == "real" for r in got) == 50


def test_flipped_bytes_inside_a_page_fail_the_load_instead_of_being_served(spark, lake, tmp_path, make_cfg):
    """Spark writes a CRC per Parquet page; every lake read verifies it. One flipped byte inside the
    embedding column's first page: an unverified read returns the rows, the snapshot load refuses."""
    import shutil

    import pyarrow.dataset as ds

    from feature_store.resolution import Snapshot

    if not tbl(spark, lake, "pair_embeddings").count():
        precompute.run(spark, lake, T)
    root = tmp_path / "tables"
    shutil.copytree(lake.lake.table_path("pair_embeddings"), root / "pair_embeddings")
    Snapshot.load(root)  # the copy loads
    path = _flip_a_byte_inside_a_page(root / "pair_embeddings", "embedding")
    unchecked = ds.ParquetFragmentScanOptions(page_checksum_verification=False)
    assert ds.dataset(path).to_table(fragment_scan_options=unchecked).num_rows > 0  # silently wrong without the CRC
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        Snapshot.load(root)
    with pytest.raises(Exception, match="(?i)checksum"):  # and every Spark reader of the table
        spark.read.format("delta").load(str(root / "pair_embeddings")).select("embedding").collect()

    # Training's reader too (model/data.py reads the log with delta-rs, without the lake layer).
    from model import data as mdata

    copy = make_cfg("crc_training")
    shutil.copytree(lake.lake.table_path("request_log"), copy.lake.table_path("request_log"))
    assert len(mdata.read_table(copy, "request_log", ["user_id"], None)) > 0
    _flip_a_byte_inside_a_page(copy.lake.table_path("request_log"), "user_id")
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        mdata.read_table(copy, "request_log", ["user_id"], None)


def _flip_a_byte_inside_a_page(table_dir: Path, column_prefix: str) -> str:
    """Flip one byte in the middle of ``column_prefix``'s first column chunk (its pages) in the
    largest data file of the table's current version; the file's path."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    # a file of the table's current version (a file an earlier MERGE or DELETE replaced is still on
    # disk until VACUUM, and no reader opens it)
    files = [f.removeprefix("file://") for f in DeltaTable(str(table_dir)).file_uris()]
    path = max(files, key=lambda f: Path(f).stat().st_size)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    column = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema.startswith(column_prefix))
    data = bytearray(Path(path).read_bytes())
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data[start + column.total_compressed_size // 2] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    return path


def test_history_is_strictly_before_t_and_empty_for_unknown_users(spark):
    ev = spark.createDataFrame([("a", "p", T - timedelta(hours=2)), ("a", "q", T - timedelta(hours=1)),
                                ("a", "late", T)], "user_id string, item_id string, ts timestamp")
    users = spark.createDataFrame([("a",), ("nobody",)], "user_id string")
    got = {r.user_id: r.history for r in embed_pairs.histories(ev, users, T, 5, 720).collect()}
    assert got == {"a": ["p", "q"]}  # the event at t is not history; users without events get no row (empty history)
    bounded = {r.user_id: r.history for r in embed_pairs.histories(ev, users, T, 5, 1.5).collect()}
    assert bounded == {"a": ["q"]}  # nothing older than the horizon is read


def test_the_spark_jobs_build_the_fm_inputs_that_training_builds(spark, lake):
    """For the pairs of a run at T: the FM inputs from Spark aggregates (precompute, neighbors) and
    from model.features (training) are the same arrays."""
    import pandas as pd

    from model import data as mdata
    from model.features import Vocab, build_examples
    from model.inference import pair_inputs

    events, items = mdata.events_and_items(lake, "synthetic")
    users = sorted(events["user_id"].unique())[:12]
    recent = events[(events["ts"] < T) & (events["ts"] >= pd.Timestamp(T) - pd.Timedelta(hours=1))]
    item_ids = sorted(recent["item_id"].value_counts().index[:4]) + sorted(items["item_id"])[:3] + ["never_seen"]
    pairs = pd.DataFrame([(u, i, "1", "2") for u in users for i in item_ids],
                         columns=["user_id", "item_id", "device", "surface"])
    vocab = Vocab.fit(pairs, events, items)
    horizon = 3.0  # hours: shorter than the log, so the bound matters
    sdf = embed_pairs.with_fm_inputs(spark.createDataFrame(pairs), tbl(spark, lake, "user_events"),
                                     tbl(spark, lake, "items"), T, 4, horizon)
    got = sdf.toPandas().assign(ts=pd.Timestamp(T)).sort_values(["user_id", "item_id"]).reset_index(drop=True)
    spark_x = pair_inputs(got, vocab, 4)
    req = got.assign(ts=pd.Timestamp(T), label=0, position=None)
    train_x = build_examples(req, events, vocab, 4, items, horizon, group_by="user_id")
    for key in ("req", "hist", "hist_cat", "hist_age", "user", "item", "category", "subcategory", "counters", "hour"):
        np.testing.assert_array_equal(spark_x[key], train_x[key], err_msg=key)
    assert (train_x["hist"] > 0).any() and (train_x["counters"][:, 0] > 0).any()  # not a comparison of empties


def test_wrong_dimension_or_nan_embeddings_are_rejected_before_merge(spark):
    ok = spark.createDataFrame([("a", "x", [0.1, 0.2])], "user_id string, item_id string, embedding array<float>")
    embed_pairs.check_embeddings(ok, 2)
    with pytest.raises(ValueError, match="expected 3 finite floats; saw sizes \\[2\\]"):
        embed_pairs.check_embeddings(ok, 3)
    nan = spark.createDataFrame([("a", "x", [0.1, float("nan")])], "user_id string, item_id string, embedding array<float>")
    with pytest.raises(ValueError, match="wrong dimension or NaN"):
        embed_pairs.check_embeddings(nan, 2)


def test_missing_or_mismatched_checkpoints_fail_before_any_write(spark, lake):
    versions = tbl(spark, lake, "pair_embeddings").count(), spark.sql(
        f"DESCRIBE HISTORY {lake.lake.database}.pair_embeddings").count()
    with pytest.raises(FileNotFoundError, match="model 'vm_click' has no version 'v0099'"):
        precompute.run(spark, replace(lake, models=replace(lake.models, vm_version="v0099")), T)
    with pytest.raises(FileNotFoundError, match="no promoted version of model 'fm'"):
        precompute.run(spark, replace(lake, models=replace(lake.models, fm_version="promoted")), T)
    ae_path = registry.resolve(lake.models_root, "autoencoder")
    meta = json.loads((ae_path / "config.json").read_text())
    original = dict(meta)
    meta["config"] = {**meta["config"], "code_dim": meta["config"]["code_dim"] + 1}
    (ae_path / "config.json").write_text(json.dumps(meta))
    try:
        with pytest.raises(registry.CheckpointMismatch, match="weights do not fit"):
            precompute.run(spark, lake, T)
    finally:
        (ae_path / "config.json").write_text(json.dumps(original))
    assert (tbl(spark, lake, "pair_embeddings").count(), spark.sql(
        f"DESCRIBE HISTORY {lake.lake.database}.pair_embeddings").count()) == versions


def test_interval_arguments_are_checked():
    with pytest.raises(ValueError, match="not an ISO time"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="empty range"):
        backfill.interval_ends(T, T - timedelta(hours=1), 1)
    assert backfill.interval_ends(T, T + timedelta(hours=2), 1) == [T, T + timedelta(hours=1), T + timedelta(hours=2)]
    assert parse_time("2026-01-05T10:00:00+01:00") == datetime(2026, 1, 5, 9)


def _start_precompute(lake, t):
    # Its own metastore (the test session holds this one); same table folders.
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(lake.lake.root_path), "SOLARIS_SPARK_MASTER": "local[2]",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    cfg_file = lake.lake.root_path / "kill.toml"
    cfg_file.write_text("[precompute]\nlookback_hours = 3\ntrending_items = 5\nrecent_items_per_user = 5\n"
                        "[models]\ndevice = \"cpu\"\n")
    log = lake.lake.root_path / "kill.log"  # what the process said, for a failure message
    with log.open("w") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.precompute", "--at", t.isoformat(), "--config",
                                 str(cfg_file)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    proc.log = log
    return proc


def _kill_when(proc, table_path: str, version: int) -> None:
    """SIGKILL ``proc`` as soon as the Delta table at ``table_path`` has moved past ``version``."""
    from deltalake import DeltaTable

    deadline = time.time() + 600
    while DeltaTable(table_path).version() == version and time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"precompute exited ({proc.returncode}) before it committed to {table_path}:\n"
                        + "\n".join(ln for ln in proc.log.read_text().splitlines() if "WARN" not in ln)[-3000:])
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_until_metastore_free(Path(table_path).parent.parent / "metastore_db")


def _wait_until_metastore_free(metastore: Path, timeout: float = 300) -> None:
    """A killed driver's JVM may take a while to die (on a loaded machine, in the middle of a
    write) and holds the embedded metastore's Derby lock until it does: the next process would
    find the metastore in use. Probe the lock itself, as the jobs do, until it is free."""
    from include.spark import metastore_locked

    deadline = time.time() + timeout
    while metastore_locked(metastore):
        if time.time() > deadline:
            pytest.fail(f"{metastore} is still locked {timeout:.0f} s after the kill; held by:\n"
                        + _lock_holders(metastore / "dbex.lck"))
        time.sleep(0.2)


def _lock_holders(lock: Path) -> str:
    """The processes /proc/locks names for ``lock``, with their state and command line."""
    inode = os.stat(lock).st_ino
    out = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5].endswith(f":{inode}"):
            pid = fields[4]
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
            except OSError:
                state, cmd = "?", "(gone)"
            out.append(f"pid {pid} state {state}: {cmd}")
    return "\n".join(out) or "(no process in /proc/locks)"


@pytest.mark.slow
def test_a_run_killed_after_its_merge_leaves_every_table_readable(spark, lake):
    """SIGKILL a precompute process right after its MERGE commit: the MERGE is there whole (every
    selected pair), and a rerun completes with exactly one committed result. (A kill right after the
    audit commit, before the MERGE, is the Airflow UI test's: the killed try leaves pair_embeddings
    untouched and Airflow's retry rewrites the same rows.)"""
    from deltalake import DeltaTable

    t = T + timedelta(hours=2)
    path = lambda n: str(lake.lake.table_path(n))  # noqa: E731
    rows = lambda: DeltaTable(path("pair_embeddings")).to_pandas().sort_values(["user_id", "item_id"]).reset_index(drop=True)  # noqa: E731
    pairs_version = DeltaTable(path("pair_embeddings")).version()

    _kill_when(_start_precompute(lake, t), path("pair_embeddings"), pairs_version)
    audit = DeltaTable(path("verifier_scores")).to_pandas()
    selected = audit[(audit["run_id"] == t.isoformat()) & audit["selected"]]
    killed = rows()
    killed_run = killed[killed["run_id"] == t.isoformat()]
    assert len(killed_run) == len(selected) > 0
    assert set(zip(killed_run["user_id"], killed_run["item_id"])) == set(zip(selected["user_id"], selected["item_id"]))

    # A rerun completes, and then the table holds exactly one committed result for the run.
    c = precompute.run(spark, lake, t)
    final = tbl(spark, lake, "pair_embeddings").where(F.col("run_id") == c.run_id).count()
    assert final == c.pairs_embedded == len(killed_run)


@pytest.mark.slow
def test_backfill_through_spark_submit_to_a_standalone_cluster(lake, tmp_path):
    """A real Spark standalone master and worker on 127.0.0.1, and one interval submitted to them."""
    from deltalake import DeltaTable

    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SOLARIS_LAKE_ROOT": str(lake.lake.root_path)}
    with StandaloneCluster(tmp_path, cores=2, memory="3g", env=env) as cluster:
        env = {**cluster.env, "SOLARIS_SPARK_MASTER": cluster.url}
        t = T + timedelta(hours=3)
        props = subprocess.run([sys.executable, "-m", "include.spark", "--out", str(tmp_path / "cluster.conf")],
                               cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
        cfg_file = tmp_path / "cluster.toml"
        cfg_file.write_text("[precompute]\nlookback_hours = 3\ntrending_items = 5\nrecent_items_per_user = 5\n")
        p = subprocess.run([str(bin_dir / "spark-submit"), "--master", cluster.url, "--properties-file", props,
                            "spark_jobs/backfill.py", "--start", (t - timedelta(hours=1)).isoformat(), "--end", t.isoformat(),
                            "--config", str(cfg_file)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        assert f"[1/1] interval ending {t.isoformat()}" in p.stdout
        runs = DeltaTable(str(lake.lake.table_path("precompute_runs"))).to_pandas()
        run = runs[runs["run_id"] == t.isoformat()].iloc[0]
        assert run["pairs_embedded"] == run["pairs_selected"] > 0
        assert any(a["name"] == "solaris" for a in cluster.state()["completedapps"])  # it really ran on the cluster


def test_vacuum_runs_on_its_cadence_and_removes_unreferenced_files(spark, make_cfg):
    from feature_store.tables import PAIR_EMBEDDINGS, ensure_tables

    cfg = make_cfg("vacuum", precompute={"vacuum_retention_hours": 0, "vacuum_every_hours": 6})
    ensure_tables(spark, cfg, (PAIR_EMBEDDINGS,))
    table = f"{cfg.lake.database}.pair_embeddings"
    for k in range(3):  # three versions: the first two overwritten, their files unreferenced
        spark.createDataFrame([("u", "i", [float(k)], "m", T, T + timedelta(hours=6), "r")], PAIR_EMBEDDINGS.schema()) \
            .write.format("delta").mode("overwrite").saveAsTable(table)
    files = lambda: len(list(cfg.lake.table_path("pair_embeddings").glob("*.parquet")))  # noqa: E731
    before = files()
    precompute.expire(spark, cfg, datetime(2026, 1, 5, 7))  # 7 is not a multiple of 6: no vacuum
    assert files() == before >= 3
    precompute.expire(spark, cfg, datetime(2026, 1, 5, 6))
    assert files() == 1
    assert [r.embedding for r in tbl(spark, cfg, "pair_embeddings").collect()] == [[2.0]]
