"""The lookup service, for real: a server on 127.0.0.1 over Delta tables, queried over HTTP, reloaded
under load, fed bad input. Tables are written with delta-rs in the declared schemas."""

import json
import re
import threading
from contextlib import contextmanager
from pathlib import Path
import time
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lookup.client import LookupClient, LookupFailed
from lookup.online import OnlineStore
from feature_store.resolution import Snapshot
from lookup.app import ConsumerCodeSpaces
from lookup.server import LookupServer
from lookup.wire import decode_binary, encode_binary

T = datetime(2026, 1, 5, 12)
TS = pa.timestamp("us", tz="UTC")
DIM = 8


def pair_table(users, items, seed, t=T, ttl=6):
    rng = np.random.default_rng(seed)
    n = len(users)
    return pa.table({"user_id": pa.array(users, pa.string()), "item_id": pa.array(items, pa.string()),
                     "embedding": pa.array(list(rng.standard_normal((n, DIM)).astype(np.float32)), pa.list_(pa.float32())),
                     "model_version": pa.array(["m"] * n, pa.string()), "computed_at": pa.array([t] * n, TS),
                     "expires_at": pa.array([t + timedelta(hours=ttl)] * n, TS), "run_id": pa.array([t.isoformat()] * n)})


def mean_table(users, seed, t=T):
    rng = np.random.default_rng(seed)
    n = len(users)
    return pa.table({"user_id": pa.array(users, pa.string()),
                     "embedding": pa.array(list(rng.standard_normal((n, DIM)).astype(np.float32)), pa.list_(pa.float32())),
                     "pair_count": pa.array([3] * n, pa.int64()), "window_start": pa.array([t - timedelta(hours=24)] * n, TS),
                     "computed_at": pa.array([t] * n, TS), "expires_at": pa.array([t + timedelta(hours=6)] * n, TS),
                     "run_id": pa.array([t.isoformat()] * n)})


def neighbor_table(rows, t=T):
    return pa.table({"user_id": pa.array([r[0] for r in rows], pa.string()), "rank": pa.array([r[1] for r in rows], pa.int32()),
                     "neighbor_id": pa.array([r[2] for r in rows], pa.string()),
                     "similarity": pa.array([r[3] for r in rows], pa.float32()),
                     "index_kind": pa.array(["IndexFlatIP"] * len(rows)), "computed_at": pa.array([t] * len(rows), TS),
                     "expires_at": pa.array([t + timedelta(hours=24)] * len(rows), TS),
                     "run_id": pa.array([t.isoformat()] * len(rows))})


def publish(root, run_id, t=T, code_version=None, shadow_code_version=None):
    versions = {f"{n}_version": DeltaTable(str(root / n)).version()
                for n in ("pair_embeddings", "user_mean_embeddings", "user_neighbors", "item_mean_embeddings")
                if (root / n).exists()}
    write_deltalake(str(root / "feature_versions"), pa.table({
        "run_id": [run_id], "interval_end": pa.array([t], TS),
        **{k: pa.array([v], pa.int64()) for k, v in versions.items()},
        "published_at": pa.array([datetime.now()], TS),
        **({"code_version": [code_version]} if code_version else {}),
        **({"shadow_code_version": [shadow_code_version]} if shadow_code_version else {})}), mode="append",
        schema_mode="merge")
    return versions


def write_version(root, seed, mode="overwrite"):
    users = [f"u{k}" for k in range(50)]
    write_deltalake(str(root / "pair_embeddings"), pair_table([u for u in users for _ in range(4)],
                                                              [f"i{(k * 7 + j) % 40}" for k in range(50) for j in range(4)], seed),
                    mode=mode)
    write_deltalake(str(root / "user_mean_embeddings"), mean_table(users[:30], seed + 1), mode=mode)
    write_deltalake(str(root / "user_neighbors"), neighbor_table(
        [(f"v{k}", r, f"u{(k + r) % 30}", 1.0 / r) for k in range(20) for r in (1, 2, 3)]), mode=mode)


def empty_miss_queue(path):
    """An empty miss_queue at ``path`` (what the first Spark job creates)."""
    write_deltalake(str(path), pa.table({
        "user_id": pa.array([], pa.string()), "item_id": pa.array([], pa.string()), "requested_at": pa.array([], TS),
        "origin": pa.array([], pa.string()), "consumed_by_run": pa.array([], pa.string())}))


@pytest.fixture
def tables(tmp_path):
    root = tmp_path / "tables"
    write_version(root, seed=1)
    publish(root, "2026-01-05T12:00:00")
    empty_miss_queue(root / "miss_queue")
    return root


@contextmanager
def serving(store, **kw):
    """A LookupServer on a free loopback port over ``store``, in a thread; stopped (store too) after."""
    srv = LookupServer(store, "127.0.0.1", 0, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        store.stop()


@pytest.fixture
def server(tables):
    store = OnlineStore(tables, poll_seconds=0.2, miss_flush_seconds=0.2).start()
    with serving(store, max_items=500, max_body_bytes=64 * 1024, allow_client_now=True) as srv:
        yield srv


NOW = T + timedelta(hours=1)
ITEMS = [f"i{k}" for k in range(40)] + ["never_seen"]


def expected(root, user, items, now=NOW):
    pub = [r for r in DeltaTable(str(root / "feature_versions")).to_pyarrow_table().to_pylist()]
    latest = max(pub, key=lambda r: r["interval_end"])
    snap = Snapshot.load(root, {k: v for k, v in latest.items() if k.endswith("_version")})
    return snap.lookup(user, items, now), latest["run_id"]


@pytest.mark.parametrize("binary", [True, False])
def test_lookup_over_http_matches_the_snapshot(server, tables, binary):
    with LookupClient(server.url, binary=binary) as c:
        for user in ("u3", "u40", "v5", "nobody"):
            emb, tiers, snapshot = c.lookup(user, ITEMS, NOW)
            (want_emb, want_tiers), run_id = expected(tables, user, ITEMS)
            assert snapshot == run_id
            np.testing.assert_array_equal(emb, want_emb)
            assert tiers == [("exact", "user_mean", "neighbor", "none")[t] for t in want_tiers]
    assert set(tiers) == {"none"}  # the unknown user


def test_a_caller_of_another_code_space_is_answered_none_and_counted(tmp_path):
    """A publication names its code space: its codes go only to a caller that reads that space (or
    names none); a caller of another space gets tier none for every item, counted in /v1/status.
    Rows of no known space (a mean table written before code spaces) are not served in it."""
    from tests.conftest import api

    root = tmp_path / "tables"
    write_version(root, seed=1)  # pair rows of code space "m"; the means table has no code_version
    publish(root, "2026-01-05T12:00:00", code_version="m")
    empty_miss_queue(root / "miss_queue")
    # the registry: consumer "click" was trained on space "m", consumer "ads" on an older one
    models = tmp_path / "models"
    for consumer, space in (("click", "m"), ("ads", "fm/v0001@old+autoencoder/v0001@old")):
        version = models / f"vm_{consumer}_solaris" / "v0001"
        version.mkdir(parents=True)
        (version / "weights.pt").write_bytes(b"")  # the lookup reads only the promoted version's window
        (version / "window.json").write_text(json.dumps({"code_version": space}))
        (models / f"vm_{consumer}_solaris" / "PROMOTED").write_text("v0001")
    store = OnlineStore(root, poll_seconds=0.2, miss_flush_seconds=0.2).start()
    with serving(store, allow_client_now=True, consumers=ConsumerCodeSpaces(models, 0.0)) as srv, \
            LookupClient(srv.url) as c:
        for ask in ({"code_version": "m"}, {}, {"consumer": "click"}):
            emb, tiers, _ = c.lookup("u3", ["i21", "i0"], NOW, **ask)
            assert tiers == ["exact", "none"] and np.abs(emb[0]).sum() > 0  # u3's mean: no known code space
            assert c.last_code_version == "m"  # the answer says its code space
        for ask in ({"code_version": "fm/v0009@other"}, {"consumer": "ads"}):
            emb, tiers, snapshot = c.lookup("u3", ["i21", "i0"], NOW, **ask)
            assert tiers == ["none", "none"] and not emb.any() and snapshot == "2026-01-05T12:00:00"
        status = api(srv.url, "/v1/status")
        assert status["code_version"] == "m" and status["code_version_mismatches"] == 2
        with pytest.raises(LookupFailed, match="code_version must be a non-empty string"):
            c.lookup("u3", ["i21"], NOW, code_version="")
        with pytest.raises(LookupFailed, match=r"\(422\).*'nobody' has no promoted SOLARIS VM"):
            c.lookup("u3", ["i21"], NOW, consumer="nobody")
        with pytest.raises(LookupFailed, match="not both"):
            c.lookup("u3", ["i21"], NOW, consumer="click", code_version="m")
        # consumer "ads" retrained on the served space and promoted: seen without a restart
        retrained = models / "vm_ads_solaris" / "v0002"
        retrained.mkdir()
        (retrained / "weights.pt").write_bytes(b"")
        (retrained / "window.json").write_text(json.dumps({"code_version": "m"}))
        (models / "vm_ads_solaris" / "PROMOTED").write_text("v0002")
        assert c.lookup("u3", ["i21"], NOW, consumer="ads")[1] == ["exact"]


def test_in_a_rollout_each_consumer_is_answered_in_its_own_code_space(tmp_path):
    """A publication that serves code space m and resolves n in shadow answers a caller of n from
    n's rows and a caller of m (or of none named) from m's; a caller of a third space gets none."""
    root = tmp_path / "tables"
    write_version(root, seed=1)  # space m
    new = pair_table(["u3"], ["i21"], seed=5)
    new = new.set_column(new.schema.get_field_index("model_version"), "model_version", pa.array(["n"], pa.string()))
    write_deltalake(str(root / "pair_embeddings"), new, mode="append")
    publish(root, "2026-01-05T12:00:00", code_version="m", shadow_code_version="n")
    empty_miss_queue(root / "miss_queue")
    rows = DeltaTable(str(root / "pair_embeddings")).to_pandas()
    code = {v: np.asarray(rows[(rows.user_id == "u3") & (rows.item_id == "i21") & (rows.model_version == v)]
                          ["embedding"].iloc[0], np.float32) for v in ("m", "n")}
    assert not np.allclose(code["m"], code["n"])
    store = OnlineStore(root, poll_seconds=0.2, miss_flush_seconds=0.2).start()
    with serving(store, allow_client_now=True) as srv, LookupClient(srv.url) as c:
        for asked, space in ((None, "m"), ("m", "m"), ("n", "n")):
            emb, tiers, _ = c.lookup("u3", ["i21"], NOW, code_version=asked)
            assert tiers == ["exact"] and c.last_code_version == space
            np.testing.assert_array_equal(emb[0], code[space])
        emb, tiers, _ = c.lookup("u3", ["i21"], NOW, code_version="x")
        assert tiers == ["none"] and not emb.any() and c.last_code_version == "m"
        from tests.conftest import api

        status = api(srv.url, "/v1/status")
        assert (status["code_version"], status["shadow_code_version"], status["code_version_mismatches"]) == ("m", "n", 1)


def test_every_tier_is_served_and_expired_rows_are_not(server):
    with LookupClient(server.url) as c:
        _, tiers, _ = c.lookup("u3", ["i21", "i0"], NOW)
        assert tiers == ["exact", "user_mean"]
        _, tiers, _ = c.lookup("v5", ["i0"], NOW)
        assert tiers == ["neighbor"]
        # The pair and the user mean both expire at T + 6 h and u3 has no neighbors: served up to the
        # last microsecond before expires_at, then nothing.
        _, tiers, _ = c.lookup("u3", ["i21"], T + timedelta(hours=6, microseconds=-1))
        assert tiers == ["exact"]
        _, tiers, _ = c.lookup("u3", ["i21"], T + timedelta(hours=6))  # expires_at: no longer served
        assert tiers == ["none"]
        _, tiers, _ = c.lookup("u3", ["i21"], T + timedelta(hours=7))
        assert tiers == ["none"]


def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(server):
    with LookupClient(server.url, binary=False) as c:
        cases = [(b"{not json", 400, "malformed JSON"), (b"[1, 2]", 400, "JSON object"),
                 (json.dumps({"item_ids": ["i1"]}).encode(), 400, "user_id"),
                 (json.dumps({"user_id": 7, "item_ids": ["i1"]}).encode(), 400, "user_id"),
                 (json.dumps({"user_id": "u1", "item_ids": "i1"}).encode(), 400, "list"),
                 (json.dumps({"user_id": "u1", "item_ids": ["i1", 2]}).encode(), 400, "item_ids[1]"),
                 (json.dumps({"user_id": "u1", "item_ids": ["i"] * 501}).encode(), 413, "too many items"),
                 (json.dumps({"user_id": "u1", "item_ids": ["i1"], "now": "yesterday"}).encode(), 400, "ISO")]
        for body, status, message in cases:
            got, _, data = c.request("POST", "/v1/lookup", body, {"Content-Type": "application/json"})
            assert got == status and message in json.loads(data)["error"], (body, got, data)
        got, _, data = c.request("POST", "/v1/lookup", b"x" * 70_000, {"Content-Type": "application/json"})
        assert got == 413 and "limit" in json.loads(data)["error"]
        got, _, _ = c.request("POST", "/v1/nothing", b"{}")
        assert got == 404
        emb, tiers, _ = c.lookup("u3", [], NOW)  # an empty candidate list is an empty answer
        assert emb.shape == (0, DIM) and tiers == []
        emb, tiers, _ = c.lookup("u3", ["i21", "i21"], NOW)  # duplicates: answered per position
        assert tiers == ["exact", "exact"] and (emb[0] == emb[1]).all()
        status, health = c.get_json("/healthz")
        assert status == 200 and health["ok"]
        status, metrics = c.request("GET", "/metrics")[0], c.request("GET", "/metrics")[2].decode()
        assert 'solaris_lookup_requests_total{status="400"} 7' in metrics
        assert 'solaris_lookup_requests_total{status="413"} 2' in metrics
        assert 'solaris_snapshot_info{run_id="2026-01-05T12:00:00"} 1' in metrics


def test_reload_under_load_answers_every_request_from_one_whole_snapshot(server, tables):
    """Clients hammer the server while a new version is published; each answer must equal the old or
    the new snapshot's answer for its X-Solaris-Snapshot, never a mix, and none may fail."""
    users = ["u3", "u17", "v5", "u29"]
    want = {"2026-01-05T12:00:00": {u: expected(tables, u, ITEMS)[0] for u in users}}
    answers, errors, stop = [], [], threading.Event()

    def hammer():
        with LookupClient(server.url) as c:
            while not stop.is_set():
                for u in users:
                    try:
                        answers.append((u, *c.lookup(u, ITEMS, NOW)))
                    except Exception as e:  # noqa: BLE001 - every failure is a test failure below
                        errors.append(repr(e))

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for th in threads:
        th.start()
    time.sleep(0.5)
    write_version(tables, seed=99)
    publish(tables, "2026-01-05T13:00:00")
    want["2026-01-05T13:00:00"] = {u: expected(tables, u, ITEMS)[0] for u in users}
    deadline = time.time() + 30
    while not any(a[3] == "2026-01-05T13:00:00" for a in answers[-50:]) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    stop.set()
    for th in threads:
        th.join()
    assert not errors
    seen = {a[3] for a in answers}
    assert seen == set(want), seen
    for user, emb, tiers, snapshot in answers:
        w_emb, w_tiers = want[snapshot][user]
        np.testing.assert_array_equal(emb, w_emb)
        assert tiers == [("exact", "user_mean", "neighbor", "none")[t] for t in w_tiers]


def test_a_corrupt_new_version_keeps_the_old_one_serving(server, tables):
    import shutil

    write_version(tables, seed=7)
    publish(tables, "2026-01-05T14:00:00")
    log = tables / "user_neighbors" / "_delta_log"
    newest = sorted(log.glob("*.json"))[-1]
    newest.write_text("{ this is not a delta log")
    deadline = time.time() + 10
    while server.store.reload_failures == 0 and time.time() < deadline:
        time.sleep(0.1)
    status = server.store.status()
    assert status["reload_failures"] >= 1 and status["snapshot_run_id"] == "2026-01-05T12:00:00"
    assert status["last_error"]
    with LookupClient(server.url) as c:
        _, tiers, snapshot = c.lookup("u3", ["i21"], NOW)
        assert snapshot == "2026-01-05T12:00:00" and tiers == ["exact"]
    shutil.rmtree(tables / "user_neighbors")  # nothing else reads it here


def test_missing_tables_at_start_serve_none_and_report_not_ready(tmp_path):
    store = OnlineStore(tmp_path / "nothing_here", poll_seconds=60, record_misses=False).start()
    with serving(store, allow_client_now=True) as srv, LookupClient(srv.url) as c:
        status, body = c.get_json("/readyz")
        assert status == 503 and not body["ready"] and "no published snapshot" in body["reason"]
        emb, tiers, snapshot = c.lookup("u1", ["i1", "i2"], NOW)
        assert tiers == ["none", "none"] and not emb.any() and snapshot is None


def test_misses_are_flushed_to_the_miss_queue(server, tables):
    with LookupClient(server.url) as c:
        c.lookup("u3", ["i21", "i0", "never_seen"], NOW)  # one exact, two misses
    deadline = time.time() + 10
    while server.store.misses.flushed < 2 and time.time() < deadline:
        time.sleep(0.1)
    rows = DeltaTable(str(tables / "miss_queue")).to_pyarrow_table().to_pylist()
    assert sorted((r["user_id"], r["item_id"], r["origin"]) for r in rows) == [
        ("u3", "i0", "lookup"), ("u3", "never_seen", "lookup")]
    assert all(r["consumed_by_run"] is None for r in rows)


def test_a_full_miss_buffer_drops_and_counts_without_blocking(tmp_path):
    from lookup.online import MissRecorder

    rec = MissRecorder(tmp_path / "no_table_yet", capacity=3, flush_seconds=60)
    rec.add("u", ["a", "b"], NOW)
    rec.add("u", ["c", "d", "e"], NOW)
    assert (rec.recorded, rec.dropped) == (3, 2)
    # the lookup never creates miss_queue (the Spark jobs do, from its declaration): kept until it exists
    assert rec.flush() == 0 and rec.flush_errors == 1 and "does not exist yet" in rec.last_error
    assert not (tmp_path / "no_table_yet" / "miss_queue").exists()
    empty_miss_queue(tmp_path / "no_table_yet" / "miss_queue")
    assert rec.flush() == 3
    assert (rec.flushed, rec.flush_errors) == (3, 1)


def test_one_client_cannot_flood_the_miss_queue(tmp_path):
    """A client replaying the same misses, or one user asking for thousands of items, queues each
    pair once and at most ``per_user`` pairs per flush interval; other users' misses still fit."""
    from lookup.online import MissRecorder

    rec = MissRecorder(tmp_path / "no_table_yet", capacity=1000, flush_seconds=60, per_user=50)
    for _ in range(100):
        rec.add("flooder", ["a", "b", "a"], NOW)
    rec.add("flooder", [f"x{n}" for n in range(5000)], NOW)
    rec.add("real", ["r1", "r2"], NOW)
    status = rec.status()
    assert status["buffered"] == 52 and (status["repeated"], status["capped"], status["dropped"]) == (298, 4952, 0)
    empty_miss_queue(tmp_path / "no_table_yet" / "miss_queue")
    assert rec.flush() == 52
    rec.add("flooder", ["a"], NOW)  # a new interval: the user may queue again
    assert rec.status()["buffered"] == 1


def test_ids_that_cannot_be_stored_get_400_and_miss_recording_goes_on(server, tables):
    """A lone surrogate (JSON's "\\ud800"), a control character or an over-long id is refused with
    the reason; misses of the requests after it still reach miss_queue."""
    raw = [('{"user_id": "u\\ud800", "item_ids": ["i1"]}', "user_id holds U+D800 at offset 1 (a lone surrogate"),
           ('{"user_id": "u1", "item_ids": ["i1", "i\\udfff"]}', "item_ids[1] holds U+DFFF"),
           ('{"user_id": "u1", "item_ids": ["a\\u0000b"]}', "item_ids[0] holds U+0000 at offset 1 (a control character)"),
           (json.dumps({"user_id": "u" * 257, "item_ids": ["i1"]}), "user_id is 257 characters long"),
           (json.dumps({"user_id": "u1", "item_ids": [""]}), "item_ids[0] is empty")]
    with LookupClient(server.url, binary=False) as c:
        for body, message in raw:
            got, _, data = c.request("POST", "/v1/lookup", body.encode(), {"Content-Type": "application/json"})
            assert got == 400 and message in json.loads(data)["error"], (body, got, data)
        c.lookup("u3", ["i0", "never_seen"], NOW)  # two misses, after the bad requests
    deadline = time.time() + 10
    while server.store.misses.flushed < 2 and time.time() < deadline:
        time.sleep(0.1)
    status = server.store.status()["misses"]
    assert (status["flushed"], status["flush_errors"], status["rejected"]) == (2, 0, 0)
    rows = DeltaTable(str(tables / "miss_queue")).to_pyarrow_table().to_pylist()
    assert sorted(r["item_id"] for r in rows) == ["i0", "never_seen"]


def test_the_miss_flusher_survives_bad_rows_and_failed_writes(tmp_path):
    """Rows with unstorable ids (only a direct caller can bring them) are rejected and counted, the
    rest of the batch is written; a failed write is counted, shown and retried with nothing lost."""
    from lookup.online import MissRecorder

    target = tmp_path / "miss_queue"
    target.write_text("a file where the table should be")  # every write fails until it is gone
    rec = MissRecorder(tmp_path, capacity=100, flush_seconds=0.05).start()
    try:
        rec.add("u\ud800", ["a"], NOW)
        rec.add("u", ["b", "c\x07"], NOW)
        deadline = time.time() + 10
        while rec.flush_errors < 2 and time.time() < deadline:
            time.sleep(0.02)
        status = rec.status()
        assert status["flush_errors"] >= 2 and status["last_error"] and status["flushed"] == 0
        assert status["rejected"] == 2 and status["buffered"] == 1  # ("u", "b") kept for the retry
        target.unlink()
        empty_miss_queue(target)
        while rec.flushed < 1 and time.time() < deadline:
            time.sleep(0.02)
        assert rec._thread.is_alive() and rec.status()["last_error"] is None
        rec.add("u", ["d"], NOW)
    finally:
        rec.stop()  # stop flushes what is left
    rows = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    assert sorted((r["user_id"], r["item_id"]) for r in rows) == [("u", "b"), ("u", "d")]
    assert (rec.recorded, rec.rejected, rec.dropped, rec.flushed) == (4, 2, 0, 2)


def test_sigterm_flushes_the_buffered_misses(tables, tmp_path):
    """The service as run in a container: SIGTERM ends it and the misses still in its buffer (the
    periodic flush is an hour away) are in miss_queue afterwards."""
    import os
    import signal

    with running_service(tables, tmp_path, miss_flush_seconds=3600) as (proc, url):
        with LookupClient(url) as c:
            _, tiers, _ = c.lookup("u3", ["i21", "i0", "never_seen"], NOW)
        assert tiers[1:] == ["user_mean", "user_mean"]
        assert DeltaTable(str(tables / "miss_queue")).to_pyarrow_table().num_rows == 0
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    rows = DeltaTable(str(tables / "miss_queue")).to_pyarrow_table().to_pylist()
    assert sorted((r["user_id"], r["item_id"]) for r in rows) == [("u3", "i0"), ("u3", "never_seen")]


def test_binary_format_round_trips():
    emb = np.arange(15, dtype=np.float32).reshape(5, 3)
    tiers = np.array([0, 1, 2, 3, 0], np.int8)
    got_emb, got_tiers = decode_binary(encode_binary(emb, tiers))
    np.testing.assert_array_equal(got_emb, emb)
    np.testing.assert_array_equal(got_tiers, tiers)
    with pytest.raises(ValueError):
        decode_binary(b"nope" + b"\0" * 20)


def test_client_raises_with_the_servers_message(server):
    with LookupClient(server.url) as c, pytest.raises(LookupFailed, match="413"):
        c.lookup("u1", ["i"] * 501)


def test_a_restarted_replica_serves_the_newest_publication_that_loads(tables):
    """The newest publication cannot load (a data file of its version is gone): a fresh store serves
    the one before and says so in its status and in /readyz; a later good one replaces it."""
    first = DeltaTable(str(tables / "pair_embeddings")).file_uris()
    write_version(tables, seed=5)
    publish(tables, "2026-01-05T13:00:00", T + timedelta(hours=1))
    broken = sorted(set(DeltaTable(str(tables / "pair_embeddings")).file_uris()) - set(first))[0]
    Path(broken.removeprefix("file://")).unlink()
    store = OnlineStore(tables, poll_seconds=3600, record_misses=False).start()
    with serving(store, max_items=10, max_body_bytes=4096) as srv:
        status = store.status()
        assert (status["ready"], status["snapshot_run_id"], status["newest_publication"]) == (
            True, "2026-01-05T12:00:00", "2026-01-05T13:00:00")
        assert status["serving_older_publication"] and list(status["skipped_publications"]) == ["2026-01-05T13:00:00"]
        with LookupClient(srv.url) as c:
            code, _, body = c.request("GET", "/readyz")
        ready = json.loads(body)
        assert code == 200 and ready["snapshot"] == "2026-01-05T12:00:00"
        assert "newer publications failed to load (2026-01-05T13:00:00)" in ready["reason"]
        write_version(tables, seed=9)
        publish(tables, "2026-01-05T14:00:00", T + timedelta(hours=2))
        assert store.poll_once() and store.status()["snapshot_run_id"] == "2026-01-05T14:00:00"
        assert not store.status()["serving_older_publication"]


def test_published_embeddings_of_another_size_are_not_ready_and_say_why(tables):
    """The registry's autoencoder gives 16 floats, the published codes are 8: every row would be
    excluded and every answer zeros. The snapshot is refused, /readyz is 503 and names both sizes."""
    store = OnlineStore(tables, dim=2 * DIM, poll_seconds=3600, record_misses=False).start()
    with serving(store) as srv:
        with LookupClient(srv.url) as c:
            code, _, body = c.request("GET", "/readyz")
        assert code == 503 and not store.ready
        reason = json.loads(body)["reason"]
        assert "published embeddings are 8 floats, the lookup answers 16" in reason and "[serve] dim = 8" in reason


def test_with_no_snapshot_the_store_answers_in_the_configured_dimension(tmp_path):
    store = OnlineStore(tmp_path / "nothing", dim=24, record_misses=False).start()
    try:
        emb, tiers, run = store.lookup("u", ["a", "b"], NOW)
        assert emb.shape == (2, 24) and not emb.any() and run is None and not store.ready
    finally:
        store.stop()


def test_a_client_may_not_choose_the_time_unless_the_operator_allows_it(tables):
    """Back-dated `now` would let a client revive expired rows (and queue misses in the past): by
    default it is refused with the reason, and a request without it resolves at the clock."""
    store = OnlineStore(tables, record_misses=False).start()
    with serving(store) as srv:
        with LookupClient(srv.url, binary=False) as c:
            code, _, body = c.request("POST", "/v1/lookup", json.dumps(
                {"user_id": "u3", "item_ids": ["i21"], "now": NOW.isoformat()}).encode(), {"Content-Type": "application/json"})
            assert code == 400 and "allow_client_now" in json.loads(body)["error"]
            emb, tiers, _ = c.lookup("u3", ["i21"])  # the clock (2026-12 or later): every test row has expired
            assert tiers == ["none"] and emb.shape == (1, DIM)


@pytest.fixture
def strict_server(tables):
    """A server with short deadlines, for the connection-level tests."""
    store = OnlineStore(tables, poll_seconds=3600, miss_flush_seconds=0.1).start()
    with serving(store, max_items=50, max_body_bytes=8192, allow_client_now=True, request_timeout=1.0,
                 keepalive_seconds=1) as srv:
        yield srv


def raw(srv, data: bytes, wait: float = 5.0, half_close: bool = False) -> bytes:
    """Send bytes on a fresh connection and read until the server closes it (or ``wait`` passes)."""
    import socket

    host, port = srv.socket.getsockname()[:2]
    with socket.create_connection((host, port), timeout=wait) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            out += b"<still open>"
    return out


def lookup_bytes(body: bytes, extra: bytes = b"", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + body)


def test_slow_or_silent_connections_are_closed_at_the_deadline(strict_server):
    """Headers that never finish, a TLS hello on the plain port, a silent connection: each is closed
    within the request deadline (1 s here), not held for ever."""
    started = time.time()
    assert raw(strict_server, b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Le") == b""
    hello = raw(strict_server, bytes.fromhex("16030100a5010000a10303") + b"\x00" * 20)
    assert hello == b"" or hello.startswith(b"HTTP/1.1 400")  # refused or dropped, and closed either way
    assert raw(strict_server, b"") == b""
    assert time.time() - started < 4.5


def test_a_body_shorter_than_its_content_length_is_never_processed(strict_server, tables):
    """The client sends a valid lookup but says it is longer, then stops: nothing is looked up, no
    miss is recorded (a server that read what came would have processed it as if whole)."""
    body = json.dumps({"user_id": "u3", "item_ids": ["never_seen"]}).encode()
    assert raw(strict_server, lookup_bytes(body, length=len(body) + 10), half_close=True) in (b"", b"<still open>")
    assert raw(strict_server, lookup_bytes(body, length=len(body) + 10)) == b""  # closed at the deadline
    time.sleep(0.5)
    assert strict_server.store.misses.recorded == 0
    assert 'status="200"' not in strict_server.metrics.prometheus(strict_server.store.status())


@pytest.mark.parametrize("headers", [b"Content-Length: \xc2\xb2\r\n", b"Content-Length: 5\r\n",
                                     b"Transfer-Encoding: chunked\r\n"], ids=["not_a_number", "duplicate", "with_chunked"])
def test_ambiguous_framing_is_refused_and_never_runs_a_second_request(strict_server, headers):
    """A Content-Length that is not one decimal number, two of them, or one beside chunked encoding:
    400 and the connection closed, so a body can never be read as a second request."""
    smuggled = b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw(strict_server, lookup_bytes(smuggled, extra=headers))
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert out.count(b"HTTP/1.1") == 1  # the body was not answered as a request of its own


def test_methods_paths_and_odd_json_get_the_right_status(strict_server):
    with LookupClient(strict_server.url, binary=False) as c:
        code, headers, body = c.request("HEAD", "/healthz")
        assert code == 200 and body == b""
        code, headers, body = c.request("GET", "/v1/lookup")
        assert code == 405 and "POST" in headers["allow"] and json.loads(body)["error"]
        code, _, body = c.request("GET", "/nope")
        assert code == 404 and "no such path /nope" in json.loads(body)["error"]
        for payload, message in ((b"[" * 2000 + b"]" * 2000, "malformed JSON"),
                                 (b'{"user_id": "u", "item_ids": [], "n": ' + b"9" * 4400 + b"}", "malformed JSON"),
                                 (json.dumps({"user_id": "u", "item_ids": ["a"], "now": "9999-12-31T23:59:59-14:00"}).encode(),
                                  "now:")):
            code, _, body = c.request("POST", "/v1/lookup", payload, {"Content-Type": "application/json"})
            assert code == 400 and message in json.loads(body)["error"], (payload[:40], code, body)
        # a body without a Content-Length is refused: 411 from the app, or 400 from the HTTP parser when
        # it meets the unframed body first (which comes first is a race). Declared JSON, so that the
        # Content-Type check (415) cannot answer before either.
        code, _, body = c.request("POST", "/v1/lookup", b"{}", {"Transfer-Encoding": "chunked",
                                                               "Content-Type": "application/json"})
        assert code in (400, 411)


def test_an_idle_kept_alive_connection_is_closed(strict_server):
    import socket

    host, port = strict_server.socket.getsockname()[:2]
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        started = time.time()
        assert s.recv(65536) == b""  # closed by the server after the keep-alive timeout (1 s)
        assert time.time() - started < 4


def test_shutdown_answers_a_request_that_reaches_a_kept_alive_connection(tables):
    """A client may send on its kept-alive connection just as the server starts to stop: that
    request is answered, with "Connection: close", not reset with the connection."""
    import socket

    store = OnlineStore(tables, poll_seconds=3600, miss_flush_seconds=0.1).start()
    with serving(store, keepalive_seconds=30) as srv:
        host, port = srv.socket.getsockname()[:2]
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            stopping = threading.Thread(target=srv.shutdown)
            stopping.start()
            time.sleep(0.3)  # the server is shutting down; this connection is idle
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            stopping.join(10)
        assert out.startswith(b"HTTP/1.1 200") and b"connection: close" in out.lower(), out
        assert not stopping.is_alive()


@contextmanager
def running_service(tables, tmp_path, **serve):
    """``python -m lookup.serve`` on the tables, as a process: yields it and its URL once it
    answers /healthz and every worker process exists, and kills it after if it is still running.
    Readiness is asked over HTTP, not read from the log: the workers' lines share one pipe."""
    import subprocess
    import sys
    import urllib.request

    import psutil

    from tests.conftest import ROOT, free_port

    port = free_port()
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[lake]\nroot = "{tables.parent}"\n[serve]\nport = {port}\nallow_client_now = true\n'
                   + "".join(f"{k} = {v}\n" for k, v in serve.items()))
    proc = subprocess.Popen([sys.executable, "-m", "lookup.serve", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()  # drained from the start
    url, workers = f"http://127.0.0.1:{port}", serve.get("workers", 1)
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the service exited {proc.returncode}: {''.join(log)}")
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2).close()
            if workers == 1 or len(psutil.Process(proc.pid).children()) == workers:
                break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"the service did not answer in 120 s: {''.join(log)}")
        time.sleep(0.1)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()


def test_workers_share_the_port_and_every_worker_flushes_its_misses_at_sigterm(tables, tmp_path):
    """``[serve] workers = 2``: two processes answer on one port, each with its own snapshot and miss
    buffer. At SIGTERM both flush at once into miss_queue (two Delta writers racing): every miss of
    every worker is there, none twice."""
    import os
    import signal

    with running_service(tables, tmp_path, workers=2, miss_flush_seconds=3600) as (proc, url):
        pids, missed = set(), []
        for k in range(300):  # a new connection each time: the kernel hands it to either worker
            with LookupClient(url) as c:
                _, tiers, _ = c.lookup("u3", ["i21", f"never_seen_{k}"], NOW)
                assert tiers[1] == "user_mean"
                missed.append(("u3", f"never_seen_{k}"))
                pids.add(json.loads(c.request("GET", "/v1/status")[2])["pid"])
            if len(pids) == 2 and k >= 20:
                break
        assert len(pids) == 2 and proc.pid not in pids  # two workers, neither the parent
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    rows = DeltaTable(str(tables / "miss_queue")).to_pyarrow_table().to_pylist()
    got = sorted((r["user_id"], r["item_id"]) for r in rows if r["item_id"].startswith("never_seen"))
    assert got == sorted(missed)


def test_every_worker_reports_the_counters_of_all_workers(tables, tmp_path):
    """Under two workers, /v1/status and /metrics count every worker's lookups, whichever worker
    answers the scrape: a counter never jumps back between two scrapes."""
    with running_service(tables, tmp_path, workers=2, record_misses="false") as (_, url):
        served = {}  # lookups per worker
        for k in range(300):  # a new connection each time: the kernel hands it to either worker
            with LookupClient(url) as c:
                c.lookup("u3", ["i21"], NOW)
                pid = json.loads(c.request("GET", "/v1/status")[2])["pid"]
            served[pid] = served.get(pid, 0) + 1
            if len(served) == 2 and k >= 20:
                break
        assert len(served) == 2
        lookups = sum(served.values())
        seen = {}
        for _ in range(300):
            with LookupClient(url, binary=False) as c:
                status = json.loads(c.request("GET", "/v1/status")[2])
                text = c.request("GET", "/metrics")[2].decode()
            seen[status["pid"]] = status
            assert status["requests"]["200"] == lookups and sum(status["pairs"].values()) == lookups
            assert re.search(rf'solaris_lookup_requests_total{{status="200"}} {lookups}(\.0)?\n', text), text
            if len(seen) == 2:
                break
        assert len(seen) == 2  # both workers answered a scrape, each with the sum


def test_a_worker_that_dies_stops_the_server_with_an_error(tables, tmp_path):
    """One of two workers is SIGKILLed: the parent stops the other (which still flushes) and exits
    non-zero, so the process manager restarts the server instead of it serving on half its workers."""
    import os
    import signal

    import psutil

    with running_service(tables, tmp_path, workers=2) as (proc, _):
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        os.kill(workers[0].pid, signal.SIGKILL)
        assert proc.wait(60) == 1
        assert not workers[1].is_running() or workers[1].status() == psutil.STATUS_ZOMBIE


def test_a_worker_that_ends_cleanly_or_a_killed_parent_leaves_nothing_serving_half(tables, tmp_path):
    """A worker told to stop on its own (SIGTERM, exit 0) still stops the server with an error; a
    SIGKILLed parent takes its workers with it, so none keeps the port."""
    import os
    import signal

    import psutil

    with running_service(tables, tmp_path, workers=2) as (proc, _):
        workers = psutil.Process(proc.pid).children()
        os.kill(workers[0].pid, signal.SIGTERM)
        assert proc.wait(60) == 1
    with running_service(tables, tmp_path, workers=2) as (proc, url):
        workers = psutil.Process(proc.pid).children()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        gone = psutil.wait_procs(workers, timeout=30)[1] == []
        assert gone, [w.pid for w in workers if w.is_running()]


def test_workers_must_be_a_sane_count():
    from include.config import ConfigError, ServeConfig

    with pytest.raises(ConfigError, match="workers"):
        ServeConfig(workers=0)


def test_head_limits_count_lines_once_whatever_the_chunking():
    from lookup.protocol import MAX_HEADER_LINE, MAX_HEADERS, MAX_REQUEST_LINE, HeadLimits

    def fed(*chunks):
        h = HeadLimits()
        return [h.feed(c) for c in chunks]

    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    assert fed(ok) == [None] and fed(*[ok[i:i + 1] for i in range(len(ok))]) == [None] * len(ok)
    assert fed(b"GET /" + b"a" * MAX_REQUEST_LINE) == [414]
    assert fed(b"GET /" + b"a" * 4000, b"a" * 4000, b"a" * 4000) == [None, None, 414]
    assert fed(b"GET / HTTP/1.1\r\nX: " + b"v" * MAX_HEADER_LINE) == [431]
    assert fed(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1)) == [431]
    assert fed(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * MAX_HEADERS + b"\r\n" + b"b" * 100_000) == [None]  # a body is no header
    h = HeadLimits()
    assert h.feed(b"\r\nGET / HTTP/1.1\r\n\r\n") is None and not h.in_head  # a leading blank line is skipped


def test_an_endless_request_line_or_header_is_refused_and_healthz_stays_fast(strict_server):
    """Clients streaming an endless request line or header get 414 / 431 after a few kilobytes and
    the connection closed; meanwhile /healthz answers as fast as it does alone."""
    import socket

    assert raw(strict_server, b"GET /" + b"a" * 20_000).startswith(b"HTTP/1.1 414")
    out = raw(strict_server, b"GET /healthz HTTP/1.1\r\nX-Bomb: " + b"a" * 20_000)
    assert out.startswith(b"HTTP/1.1 431") and b"header line over" in out
    assert raw(strict_server, b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n").startswith(b"HTTP/1.1 431")
    host, port = strict_server.socket.getsockname()[:2]
    stop, refused = threading.Event(), []

    def attack():
        while not stop.is_set():
            try:
                with socket.create_connection((host, port), timeout=2) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nX-Bomb: ")
                    while not stop.is_set():
                        s.sendall(b"a" * 1024)
            except OSError:
                refused.append(1)  # answered 431 and closed: the attacker starts over

    attackers = [threading.Thread(target=attack, daemon=True) for _ in range(8)]
    for t in attackers:
        t.start()
    try:
        slowest = 0.0
        with LookupClient(strict_server.url, binary=False) as c:
            for _ in range(30):
                started = time.perf_counter()
                code, _, _ = c.request("GET", "/healthz")
                slowest = max(slowest, time.perf_counter() - started)
                assert code == 200
    finally:
        stop.set()
        for t in attackers:
            t.join(5)
    assert refused, "the attackers were never cut off"
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s under the attack"


def test_idle_sockets_cannot_lock_clients_out(tables):
    """An attacker holds far more silent connections than the server admits (20 here): each new
    connection beyond the limit closes the one idle longest, so a real client is answered, and
    the evictions are counted in /metrics."""
    import socket

    store = OnlineStore(tables, poll_seconds=3600, record_misses=False).start()
    with serving(store, max_connections=20, request_timeout=30.0) as srv:
        host, port = srv.socket.getsockname()[:2]
        idle = [socket.create_connection((host, port), timeout=5) for _ in range(200)]
        try:
            time.sleep(0.3)
            with LookupClient(srv.url, binary=False) as c:
                for _ in range(5):
                    code, _, body = c.request("POST", "/v1/lookup", json.dumps({"user_id": "u3", "item_ids": ["i21"]}).encode(),
                                              {"Content-Type": "application/json"})
                    assert code == 200, body
                code, _, text = c.request("GET", "/metrics")
            evicted = int(re.search(rb"solaris_lookup_connections_evicted_total (\d+)", text).group(1))
            assert evicted >= 180 and b'status="503"' not in text
        finally:
            for s in idle:
                s.close()


def test_browsers_declared_types_and_hosts_cannot_steer_the_lookup(server):
    """A web page may POST text/plain to a loopback address without a preflight: a lookup must be
    declared JSON (415) and one a browser sends for a page (Origin) is refused (403). Accept with
    q=0 for the binary type gets JSON. A trailing slash is a 404, not a redirect built from Host.
    /v1/status carries the request and error counters; the snapshot's age is the data's."""
    body = json.dumps({"user_id": "u3", "item_ids": ["i21"]}).encode()
    with LookupClient(server.url, binary=False) as c:
        code, _, out = c.request("POST", "/v1/lookup", body, {"Content-Type": "text/plain"})
        assert code == 415 and "application/json" in json.loads(out)["error"]
        code, _, out = c.request("POST", "/v1/lookup", body, {"Content-Type": "application/json",
                                                              "Origin": "https://evil.example"})
        assert code == 403
        code, headers, _ = c.request("POST", "/v1/lookup", body, {"Content-Type": "application/json",
                                                                  "Accept": "application/octet-stream;q=0, application/json"})
        assert code == 200 and headers["content-type"].startswith("application/json")
        code, headers, _ = c.request("POST", "/v1/lookup", body, {"Content-Type": "application/json",
                                                                  "Accept": "application/octet-stream"})
        assert code == 200 and headers["content-type"].startswith("application/octet-stream")
        code, headers, _ = c.request("GET", "/healthz/", headers={"Host": "evil.example"})
        assert code == 404 and "location" not in headers
        code, _, out = c.request("GET", "/v1/status")
        status = json.loads(out)
        assert status["requests"]["200"] >= 2 and status["requests"]["415"] == 1 and status["errors"] >= 2
        assert status["snapshot_data_age_seconds"] > status["snapshot_loaded_seconds_ago"]
        code, _, text = c.request("GET", "/metrics")
        age = float(re.search(rb"solaris_snapshot_age_seconds ([\d.]+)", text).group(1))
        assert abs(age - status["snapshot_data_age_seconds"]) < 60


def test_a_damaged_delta_log_is_reported_as_one_line_naming_the_table(tables):
    """A newer publication whose pair_embeddings commit is damaged: the store keeps serving the one
    before, and its error names the table in one plain line (no backtrace, no colour codes)."""
    write_version(tables, seed=5)
    publish(tables, "2026-01-05T13:00:00", T + timedelta(hours=1))
    log_dir = tables / "pair_embeddings" / "_delta_log"
    newest = sorted(log_dir.glob("*.json"))[-1]
    newest.write_text("{garbage")
    store = OnlineStore(tables, poll_seconds=3600, record_misses=False).start()
    try:
        status = store.status()
        assert status["ready"] and status["snapshot_run_id"] == "2026-01-05T12:00:00"
        error = status["skipped_publications"]["2026-01-05T13:00:00"]
        assert "table pair_embeddings at " in error and "\x1b[" not in error and "\n" not in error, error
    finally:
        store.stop()
