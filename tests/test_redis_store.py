"""Redis as the online backend: a real redis-server on loopback, the publish step, and answers equal
to the embedded store's for the same snapshot (the same rule), over HTTP too."""

import os
import shutil
import subprocess
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from lookup.client import LookupClient
from lookup.online import latest_publication
from feature_store.resolution import Snapshot
from lookup.server import LookupServer
from tests.conftest import free_port
from tests.test_serve import ITEMS, NOW, T, publish, write_version

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("SOLARIS_REQUIRE_REDIS"):
            pytest.fail("redis-server is required here (SOLARIS_REQUIRE_REDIS) but not installed")
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def published(tmp_path, redis_url):
    import redis

    from lookup.redis_store import publish as publish_redis

    root = tmp_path / "tables"
    write_version(root, seed=3)
    publish(root, "2026-01-05T12:00:00")
    pub = latest_publication(root)
    snap = Snapshot.load(root, pub.versions, run_id=pub.run_id)
    counts = publish_redis(snap, redis.Redis.from_url(redis_url), prefix="t")
    return root, snap, counts


USERS = ["u3", "u17", "u40", "v5", "v11", "nobody"]


def test_redis_answers_equal_the_embedded_snapshot(published, redis_url):
    from lookup.redis_store import RedisStore

    root, snap, counts = published
    assert counts["pairs"] == snap.stats["pairs"] and counts["user_means"] == snap.stats["user_means"]
    store = RedisStore(redis_url, prefix="t")
    for user in USERS:
        for now in (NOW, T + timedelta(hours=7), T - timedelta(minutes=1)):
            emb, tiers, run_id = store.lookup(user, ITEMS, now)
            want_emb, want_tiers = snap.lookup(user, ITEMS, now)
            assert run_id == "2026-01-05T12:00:00"
            np.testing.assert_array_equal(tiers, want_tiers)
            np.testing.assert_allclose(emb, want_emb, rtol=1e-6, atol=1e-7)
    _, tiers, _ = store.lookup("v5", ITEMS, NOW)
    assert 2 in tiers  # the neighbor tier (code 2) is exercised, through the second round trip
    store.stop()


def test_a_new_publication_switches_the_pointer_and_expires_the_old_namespace(published, redis_url):
    import redis

    from lookup.redis_store import RedisStore
    from lookup.redis_store import publish as publish_redis

    root, _, first = published
    write_version(root, seed=4)
    publish(root, "2026-01-05T13:00:00")
    pub = latest_publication(root)
    snap = Snapshot.load(root, pub.versions, run_id=pub.run_id)
    r = redis.Redis.from_url(redis_url)
    counts = publish_redis(snap, r, prefix="t", grace_seconds=60)
    assert counts["old_keys_expiring"] > 0
    assert r.get("t:current").startswith(b"t:2026-01-05T13:00:00:") and counts["namespace"] == r.get("t:current").decode()
    # the namespace it replaced (an earlier test's copies may still be expiring with their own grace)
    assert 0 < r.ttl(next(iter(r.scan_iter(match=f"{first['namespace']}:p:*")))) <= 60
    store = RedisStore(redis_url, prefix="t", pointer_seconds=0)
    emb, tiers, run_id = store.lookup("u3", ITEMS, NOW)
    want_emb, want_tiers = snap.lookup("u3", ITEMS, NOW)
    assert run_id == "2026-01-05T13:00:00"
    np.testing.assert_array_equal(tiers, want_tiers)
    np.testing.assert_allclose(emb, want_emb, rtol=1e-6)


def test_the_http_service_on_the_redis_backend(published, redis_url):
    from lookup.redis_store import RedisStore

    _, snap, _ = published
    store = RedisStore(redis_url, prefix="t")
    srv = LookupServer(store, "127.0.0.1", 0, allow_client_now=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with LookupClient(srv.url) as c:
            emb, tiers, snapshot = c.lookup("u17", ITEMS, NOW)
            want_emb, want_tiers = snap.lookup("u17", ITEMS, NOW)
            assert snapshot == "2026-01-05T12:00:00"
            assert tiers == [("exact", "user_mean", "neighbor", "none")[t] for t in want_tiers]
            np.testing.assert_allclose(emb, want_emb, rtol=1e-6)
            status, ready = c.get_json("/readyz")
            assert status == 200 and ready["ready"]
    finally:
        srv.shutdown()
        srv.server_close()
        store.stop()


def test_nothing_published_to_redis_serves_none_and_is_not_ready(redis_url):
    from lookup.redis_store import RedisStore

    store = RedisStore(redis_url, prefix="empty")
    emb, tiers, run_id = store.lookup("u1", ["i1"], NOW)
    assert list(tiers) == [3] and not emb.any() and run_id is None
    assert not store.status()["ready"]
    store.stop()


def start_redis(tmp_path, port):
    import redis

    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    client, deadline = redis.Redis(port=port), time.time() + 10
    while time.time() < deadline:
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def serve_on_own_redis(tmp_path, snap, prefix: str):
    """A redis-server of the test's own with ``snap`` published, and a lookup server over it:
    (redis process, its url, store, server). The caller stops them."""
    import redis

    from lookup.redis_store import RedisStore
    from lookup.redis_store import publish as publish_redis

    port = free_port()
    proc = start_redis(tmp_path, port)
    url = f"redis://127.0.0.1:{port}/0"
    publish_redis(snap, redis.Redis.from_url(url), prefix=prefix)
    store = RedisStore(url, prefix=prefix, pointer_seconds=0)
    srv = LookupServer(store, "127.0.0.1", 0, allow_client_now=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return proc, url, store, srv


def test_redis_down_while_serving_is_a_clear_503_and_serving_resumes(tmp_path, redis_url):
    """Redis stops under a running lookup: requests get 503 with the reason and Retry-After (fast, not
    hung), /readyz says not ready; once Redis and its data are back, answers come again."""
    import redis

    from lookup.redis_store import publish as publish_redis

    root = tmp_path / "tables"
    write_version(root, seed=3)
    publish(root, "2026-01-05T12:00:00")
    snap = Snapshot.load(root, latest_publication(root).versions, run_id="2026-01-05T12:00:00")
    proc, url, store, srv = serve_on_own_redis(tmp_path, snap, "d")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with LookupClient(srv.url) as c:
            assert c.lookup("u17", ITEMS, NOW)[2] == "2026-01-05T12:00:00"
            proc.terminate()
            proc.wait(10)
            started = time.time()
            code, headers, body = c.request("POST", "/v1/lookup", b'{"user_id": "u17", "item_ids": ["i1"]}', {"Content-Type": "application/json"})
            assert code == 503 and headers["retry-after"] == "1" and b"redis unavailable" in body
            assert time.time() - started < 3
            status, ready = c.get_json("/readyz")
            assert status == 503 and "redis unavailable" in ready["reason"]
            proc = start_redis(tmp_path, port)
            publish_redis(snap, redis.Redis.from_url(url), prefix="d")
            assert c.lookup("u17", ITEMS, NOW)[2] == "2026-01-05T12:00:00"
    finally:
        srv.shutdown()
        srv.server_close()
        store.stop()
        proc.terminate()


def test_redis_down_during_publish_fails_the_task_and_keeps_the_served_namespace(published, redis_url, tmp_path):
    """A publish that cannot reach Redis raises (the DAG task fails and is retried) and a publish that
    dies midway never switches the pointer: readers stay on the namespace they had."""
    import redis

    from lookup.redis_store import RedisStore
    from lookup.redis_store import publish as publish_redis

    root, snap, _ = published
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(redis.ConnectionError):
        publish_redis(snap, redis.Redis.from_url(dead, socket_connect_timeout=0.5), prefix="t")
    r = redis.Redis.from_url(redis_url)
    before = r.get("t:current")

    class DiesMidway(redis.Redis):  # the real server; the connection drops after the first batch of writes
        def pipeline(self, *a, **kw):
            pipe, sent = super().pipeline(*a, **kw), []
            execute = pipe.execute

            def first_batch_only(*args, **kwargs):
                sent.append(1)
                if len(sent) > 1:
                    raise redis.ConnectionError("connection lost midway")
                return execute(*args, **kwargs)

            pipe.execute = first_batch_only
            return pipe

    write_version(root, seed=11)
    publish(root, "2026-01-05T15:00:00", T + timedelta(hours=3))
    newer = Snapshot.load(root, latest_publication(root).versions, run_id="2026-01-05T15:00:00")
    with pytest.raises(redis.ConnectionError, match="midway"):
        publish_redis(newer, DiesMidway.from_url(redis_url), prefix="t", batch=5)
    assert r.get("t:current") == before  # the half-written namespace is not served
    assert RedisStore(redis_url, prefix="t").lookup("u3", ["i21"], NOW)[2] == "2026-01-05T12:00:00"


def test_the_item_tier_on_redis_equals_the_embedded_snapshot(tmp_path, redis_url):
    import pyarrow as pa
    import redis
    from deltalake import write_deltalake

    from lookup.redis_store import RedisStore
    from lookup.redis_store import publish as publish_redis
    from model.tiers import ITEM_MEAN, NEIGHBOR
    from tests.test_serve import TS, mean_table

    root = tmp_path / "tables"
    write_version(root, seed=5)
    # item means for i30..i39 and one never shown to anybody; i35's expired an hour before NOW
    items = [f"i{k}" for k in range(30, 40)] + ["fresh"]
    table = mean_table(items, seed=9).rename_columns(["item_id", *mean_table(["x"], 1).column_names[1:]])
    expires = [T + timedelta(hours=6)] * len(items)
    expires[5] = NOW - timedelta(hours=1)
    write_deltalake(str(root / "item_mean_embeddings"), table.set_column(5, "expires_at", pa.array(expires, TS)))
    publish(root, "2026-01-05T12:00:00")
    pub = latest_publication(root)
    assert "item_mean_embeddings_version" in pub.versions
    snap = Snapshot.load(root, pub.versions, run_id=pub.run_id)
    counts = publish_redis(snap, redis.Redis.from_url(redis_url), prefix="items")
    assert counts["item_means"] == len(items) == snap.stats["item_means"]
    store = RedisStore(redis_url, prefix="items")
    seen = set()
    for user in USERS:
        emb, tiers, _ = store.lookup(user, ITEMS + ["fresh"], NOW)
        want_emb, want_tiers = snap.lookup(user, ITEMS + ["fresh"], NOW)
        np.testing.assert_array_equal(tiers, want_tiers)
        np.testing.assert_allclose(emb, want_emb, rtol=1e-6, atol=1e-7)
        seen |= set(tiers.tolist())
    _, tiers = snap.lookup("nobody", ["fresh", "i35", "i36"], NOW)
    assert tiers.tolist() == [ITEM_MEAN, 3, ITEM_MEAN]  # a stranger gets the item's mean, never an expired one
    assert {ITEM_MEAN, NEIGHBOR} <= seen
    store.stop()


def test_a_republished_run_gets_a_new_namespace_and_leaves_nothing_behind(published, redis_url):
    """Publishing the same run again (after its tables changed, e.g. a rerun that dropped pairs)
    writes a fresh namespace and switches to it: a pair the new copy lacks is no longer served."""
    import redis

    from lookup.redis_store import RedisStore
    from lookup.redis_store import publish as publish_redis

    _, snap, first = published
    r = redis.Redis.from_url(redis_url)
    store = RedisStore(redis_url, prefix="t", pointer_seconds=0)
    _, tiers, _ = store.lookup("u3", ITEMS, NOW)
    assert 0 in tiers  # u3 has exact pairs
    empty = Snapshot.from_arrow(None, None, None, snap.dim, snap.run_id)  # the same run, now without rows
    second = publish_redis(empty, r, prefix="t", grace_seconds=60)
    assert second["namespace"] != first["namespace"] and second["old_keys_expiring"] > 0
    _, tiers, run_id = store.lookup("u3", ITEMS, NOW)
    assert run_id == snap.run_id and list(tiers) == [3] * len(ITEMS)


def test_a_stale_pointer_or_codes_of_another_size_are_not_ready(published, redis_url):
    """The pointer names a namespace whose keys are gone (expired, flushed): not ready, and says
    so, instead of ready with zeros. Codes of another size than the lookup answers: the same."""
    import redis

    from lookup.redis_store import RedisStore

    _, snap, counts = published
    wrong = RedisStore(redis_url, prefix="t", pointer_seconds=0, dim=snap.dim * 2)
    status = wrong.status()
    assert not status["ready"] and f"published embeddings are {snap.dim} floats" in status["last_error"]
    emb, tiers, _ = wrong.lookup("u3", ITEMS, NOW)
    assert emb.shape == (len(ITEMS), snap.dim * 2) and list(tiers) == [3] * len(ITEMS)
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(match=f"{counts['namespace']}:*"):
        r.delete(key)
    store = RedisStore(redis_url, prefix="t", pointer_seconds=0)
    status = store.status()
    assert not status["ready"] and "is gone (expired or flushed)" in status["last_error"]
    assert store.lookup("u3", ITEMS, NOW)[2] is None


def test_a_hung_redis_never_stalls_healthz(published, redis_url, tmp_path):
    """Redis stops answering (SIGSTOP: connections open, no replies). Lookups fail with 503 after
    the store's timeout, on worker threads; /healthz stays fast all the while."""
    import signal

    _, snap, _ = published
    proc, _, store, srv = serve_on_own_redis(tmp_path, snap, "t")
    results = []
    try:
        proc.send_signal(signal.SIGSTOP)

        def lookup():
            with LookupClient(srv.url, binary=False) as c:
                results.append(c.request("POST", "/v1/lookup", b'{"user_id": "u3", "item_ids": ["i1"]}',
                                         {"Content-Type": "application/json"})[0])

        callers = [threading.Thread(target=lookup) for _ in range(8)]
        for t in callers:
            t.start()
        slowest = 0.0
        with LookupClient(srv.url, binary=False) as c:
            for _ in range(10):
                started = time.perf_counter()
                assert c.request("GET", "/healthz")[0] == 200
                slowest = max(slowest, time.perf_counter() - started)
        for t in callers:
            t.join(30)
        assert results == [503] * 8 and slowest < 0.3, (results, slowest)
    finally:
        proc.send_signal(signal.SIGCONT)
        srv.shutdown()
        srv.server_close()
        store.stop()
        proc.terminate()
        proc.wait(timeout=10)
