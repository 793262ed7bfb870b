"""Redis as the shared online backend, for many serving replicas.

    python -m lookup.redis_store --redis-url redis://127.0.0.1:6379/0 [--config F]   (after publish)
    python -m lookup.serve --backend redis --redis-url redis://127.0.0.1:6379/0

The publish step copies the newest published snapshot (read with delta-rs) into a namespace of
its own, ``<prefix>:<run_id>:<publish time>``, then points ``<prefix>:current`` at it in one SET; the previous
namespace expires after a grace period, so a replica that read the old pointer a moment ago still
finds its keys. Keys of a namespace:

- ``p:<user>``: hash, field item -> 16-byte validity (computed_at, expires_at: int64 UTC µs) + dim float32
- ``m:<user>``: the user mean, the same layout
- ``i:<item>``: the item mean, the same layout
- ``n:<user>``: validity, uint32 k, k float32 similarities, then the k neighbor ids joined by 0x1f
- ``meta``: JSON with the run id, versions and dim

A lookup reads the pointer (cached for ``pointer_seconds``), then in one pipelined round trip the
user's exact pairs (HMGET), the candidates' item means (MGET), the user's mean and neighbors; only when a candidate needs the neighbor tier, a
second round trip reads the neighbors' pairs and means. The fetched rows become a small Snapshot
and the shared rule resolves them, so Redis and the embedded store cannot answer differently.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
from datetime import datetime

import numpy as np

from feature_store.lake import utc_now
from feature_store.resolution import NONE, Snapshot
from lookup.store import LookupStore, StoreUnavailable

SEP = "\x1f"


def _pack(valid: np.ndarray, emb: np.ndarray) -> bytes:
    return struct.pack("<qq", int(valid[0]), int(valid[1])) + np.ascontiguousarray(emb, "<f4").tobytes()


def publish(snapshot: Snapshot, redis, prefix: str = "solaris", grace_seconds: int = 300, batch: int = 2000) -> dict:
    """Write ``snapshot`` under a new namespace and switch the pointer to it; returns counts. The
    namespace is new on every publish, also of the same run (``<prefix>:<run_id>:<ns time>``): a
    republished run never rewrites the keys replicas are reading, and pairs it no longer holds are
    not left behind in the live namespace."""
    ns = f"{prefix}:{snapshot.run_id}:{time.time_ns()}"
    users, items = snapshot.users, snapshot.items
    n_items = max(len(items), 1)
    pipe = redis.pipeline(transaction=False)
    pending = 0

    def step():
        nonlocal pending
        pending += 1
        if pending >= batch:
            pipe.execute()
            pending = 0

    for key, emb, valid in zip(snapshot.pair_keys, snapshot.pair_embedding, snapshot.pair_valid):
        pipe.hset(f"{ns}:p:{users[key // n_items]}", items[key % n_items], _pack(valid, emb))
        step()
    has_mean = np.flatnonzero(snapshot.mean_valid[:-1, 1] != np.iinfo(np.int64).min)
    for u in has_mean:
        pipe.set(f"{ns}:m:{users[u]}", _pack(snapshot.mean_valid[u], snapshot.mean_embedding[u]))
        step()
    has_item_mean = np.flatnonzero(snapshot.item_mean_valid[:-1, 1] != np.iinfo(np.int64).min)
    for i in has_item_mean:
        pipe.set(f"{ns}:i:{items[i]}", _pack(snapshot.item_mean_valid[i], snapshot.item_mean_embedding[i]))
        step()
    k = snapshot.neighbor_ids.shape[1]
    has_nb = np.flatnonzero((snapshot.neighbor_ids[:-1] >= 0).any(axis=1)) if k else np.zeros(0, np.int64)
    for u in has_nb:
        ids = snapshot.neighbor_ids[u]
        keep = ids >= 0
        sims = snapshot.neighbor_similarity[u][keep]
        raw = struct.pack("<qqI", int(snapshot.neighbor_valid[u][0]), int(snapshot.neighbor_valid[u][1]), len(sims)) \
            + sims.astype("<f4").tobytes() + SEP.join(users[ids[keep]]).encode()
        pipe.set(f"{ns}:n:{users[u]}", raw)
        step()
    pipe.set(f"{ns}:meta", json.dumps({"run_id": snapshot.run_id, "dim": snapshot.dim, "stats": snapshot.stats,
                                        "code_version": snapshot.code_version}))
    pipe.execute()
    old = redis.getset(f"{prefix}:current", ns)
    old = old.decode() if isinstance(old, bytes) else old
    expired = 0
    if old and old != ns:  # readers of the old pointer get a grace period, then the keys go
        for key in redis.scan_iter(match=f"{old}:*", count=1000):
            redis.expire(key, grace_seconds)
            expired += 1
    return {"namespace": ns, "pairs": int(len(snapshot.pair_keys)), "user_means": int(len(has_mean)),
            "item_means": int(len(has_item_mean)),
            "users_with_neighbors": int(len(has_nb)), "old_keys_expiring": expired}


class RedisStore(LookupStore):
    """The lookup interface of OnlineStore (lookup, status, stop), reading Redis.

    Ready only when the pointer names a namespace whose ``meta`` is there (a namespace expired or
    flushed under a stale pointer is not ready, and says so) and, with ``dim`` given, whose codes
    have that size; otherwise every lookup answers tier ``none`` in ``dim`` floats."""

    blocking = True  # network round trips: the server calls it from worker threads

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "solaris", pointer_seconds: float = 1.0,
                 timeout_seconds: float = 0.5, dim: int | None = None):
        import redis

        self.dim = dim
        # A Redis that is down fails a lookup in ``timeout_seconds``, not the client's patience.
        self.redis = redis.Redis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds)
        self.prefix, self.pointer_seconds = prefix, pointer_seconds
        self._pointer: tuple[float, str | None, dict] = (0.0, None, {})
        self.misses = None
        self.code_version_mismatches = 0  # lookups that named another code space than the one served
        self._count_lock = threading.Lock()  # lookups run on worker threads (the server calls a blocking store so)
        self._code_versions: dict[str, str | None] = {}  # run id -> its code space, for each namespace read

    def _namespace(self) -> tuple[str | None, dict]:
        """The namespace to read (None: nothing usable, ``meta["problem"]`` says why) and its meta."""
        at, ns, meta = self._pointer
        if time.monotonic() - at > self.pointer_seconds:
            raw = self.redis.get(f"{self.prefix}:current")
            ns = raw.decode() if raw else None
            meta_raw = self.redis.get(f"{ns}:meta") if ns else None
            meta = json.loads(meta_raw) if meta_raw else {}
            if ns is None:
                meta = {"problem": "nothing published to Redis yet"}
            elif not meta_raw:
                meta, ns = {"problem": f"the published namespace {ns} is gone (expired or flushed): publish again"}, None
            elif self.dim is not None and meta.get("dim") != self.dim:
                meta = {**meta, "problem": f"the published embeddings are {meta.get('dim')} floats, the lookup answers "
                                           f"{self.dim}: publish codes of the configured autoencoder"}
                ns = None
            self._pointer = (time.monotonic(), ns, meta)
            if meta.get("run_id"):
                self._code_versions[meta["run_id"]] = meta.get("code_version")
        return ns, meta

    def answer_space(self, run_id: str | None, code_version: str | None = None) -> str | None:
        """The code space of an answer of the published snapshot ``run_id``: the one it serves (a
        Redis namespace holds one code space; a consumer of a rollout's new one is answered none)."""
        return self._code_versions.get(run_id) if run_id else None

    def lookup(self, user_id: str, item_ids, now: datetime | None = None, code_version: str | None = None):
        import redis

        try:
            return self._lookup(user_id, item_ids, now, code_version)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            self._pointer = (0.0, None, {})  # look the pointer up again once Redis is back
            raise StoreUnavailable(f"redis unavailable: {e}") from e

    def _lookup(self, user_id: str, item_ids, now: datetime | None, code_version: str | None = None):
        now = now or utc_now()
        items = [str(i) for i in item_ids]
        ns, meta = self._namespace()
        dim = int(self.dim or meta.get("dim") or 32)
        mismatch = code_version is not None and code_version != meta.get("code_version")
        if mismatch:
            with self._count_lock:  # this process's count; each replica counts its own
                self.code_version_mismatches += 1
        if ns is None or not items or mismatch:
            return np.zeros((len(items), dim), np.float32), np.full(len(items), NONE, np.int8), \
                meta.get("run_id") if ns else None
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(f"{ns}:p:{user_id}", items)
        pipe.mget([f"{ns}:i:{i}" for i in items])
        pipe.get(f"{ns}:m:{user_id}")
        pipe.get(f"{ns}:n:{user_id}")
        exact, item_mean, mean, nb = pipe.execute()
        pairs = [(user_id, i, r) for i, r in zip(items, exact) if r is not None]
        item_means = list({i: (i, r) for i, r in zip(items, item_mean) if r is not None}.values())
        means = [(user_id, mean)] if mean is not None else []
        neighbors = []
        if nb is not None:
            a, b, k = struct.unpack("<qqI", nb[:20])
            sims = np.frombuffer(nb, "<f4", k, 20)
            ids = nb[20 + 4 * k:].decode().split(SEP) if k else []
            neighbors = [(user_id, r + 1, v, float(s), a, b) for r, (v, s) in enumerate(zip(ids, sims))]
        snap = self._snapshot(pairs, means, neighbors, dim, meta.get("run_id"), item_means)
        emb, tiers = snap.lookup(user_id, items, now)
        rest = [i for i, t in zip(items, tiers) if t == NONE]
        if neighbors and rest:  # second round trip only for the candidates that need the neighbor tier
            pipe = self.redis.pipeline(transaction=False)
            for _, _, v, _, _, _ in neighbors:
                pipe.hmget(f"{ns}:p:{v}", rest)
                pipe.get(f"{ns}:m:{v}")
            got = pipe.execute()
            for j, (_, _, v, _, _, _) in enumerate(neighbors):
                pairs += [(v, i, r) for i, r in zip(rest, got[2 * j]) if r is not None]
                if got[2 * j + 1] is not None:
                    means.append((v, got[2 * j + 1]))
            snap = self._snapshot(pairs, means, neighbors, dim, meta.get("run_id"), item_means)
            emb, tiers = snap.lookup(user_id, items, now)
        return emb, tiers, meta.get("run_id")

    @staticmethod
    def _snapshot(pairs, means, neighbors, dim: int, run_id, item_means=()) -> Snapshot:
        """The fetched rows as a small Snapshot, decoded in bulk (one frombuffer per table)."""
        record = np.dtype([("a", "<i8"), ("b", "<i8"), ("e", "<f4", (dim,))])

        def decode(raws):
            ok = np.array([len(r) == record.itemsize for r in raws], bool)
            rec = np.frombuffer(b"".join(r for r, good in zip(raws, ok) if good), record)
            emb = np.zeros((len(raws), dim), np.float32)
            valid = np.zeros((len(raws), 2), np.int64)
            emb[ok], valid[ok, 0], valid[ok, 1] = rec["e"], rec["a"], rec["b"]
            return emb, ok & np.isfinite(emb).all(axis=1), valid

        p_emb, p_ok, p_valid = decode([x[2] for x in pairs])
        m_emb, m_ok, m_valid = decode([x[1] for x in means])
        i_emb, i_ok, i_valid = decode([x[1] for x in item_means])
        return Snapshot.from_columns(
            dim, ([x[0] for x in pairs], [x[1] for x in pairs], p_emb, p_ok, p_valid),
            ([x[0] for x in means], m_emb, m_ok, m_valid),
            ([x[0] for x in neighbors], np.array([x[1] for x in neighbors], np.int64), [x[2] for x in neighbors],
             np.array([x[3] for x in neighbors], np.float32),
             np.array([(x[4], x[5]) for x in neighbors], np.int64).reshape(-1, 2)), run_id,
            ([x[0] for x in item_means], i_emb, i_ok, i_valid))

    def status(self) -> dict:
        import redis

        try:
            ns, meta = self._namespace()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            return {"ready": False, "snapshot_run_id": None, "snapshot_versions": None, "code_version": None,
                    "code_version_mismatches": self.code_version_mismatches,
                    "snapshot_loaded_seconds_ago": 0.0,
                    "snapshot_stats": {}, "dim": None, "reloads": 0, "reload_failures": 0,
                    "last_error": f"redis unavailable: {e}", "misses": None, "backend": "redis"}
        return {"ready": ns is not None, "snapshot_run_id": meta.get("run_id") if ns else None, "snapshot_versions": None,
                "code_version": meta.get("code_version") if ns else None,
                "code_version_mismatches": self.code_version_mismatches,
                "snapshot_loaded_seconds_ago": 0.0, "snapshot_stats": meta.get("stats", {}) if ns else {},
                "dim": self.dim or meta.get("dim"), "reloads": 0, "reload_failures": 0,
                "last_error": meta.get("problem"), "misses": None, "backend": "redis"}

    def stop(self) -> None:
        self.redis.close()


def publish_latest(cfg, url: str | None = None, prefix: str | None = None) -> dict:
    """Copy the lake's newest publication to Redis (``[redis]`` url and prefix unless given); its counts.
    ``LookupError`` when nothing is published yet."""
    import redis

    from lookup.online import latest_publication

    tables = cfg.lake.tables_path
    pub = latest_publication(tables)
    if pub is None:
        raise LookupError(f"nothing published under {tables} yet")
    snap = Snapshot.load(tables, pub.versions, run_id=pub.run_id)
    return publish(snap, redis.Redis.from_url(url or cfg.redis.url), prefix or cfg.redis.prefix)


def publish_task() -> str:
    """The DAGs' publish_redis task: publish when ``[redis] publish`` is on (``SOLARIS_REDIS_URL`` set); else say so."""
    from include.config import load_config

    cfg = load_config()
    if not cfg.redis.publish:
        return "[redis] publish is off (SOLARIS_REDIS_URL is not set): the embedded lookup serves the lake directly"
    return str(publish_latest(cfg))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lookup.redis_store", description="Publish the newest snapshot to Redis.")
    p.add_argument("--config", help="SOLARIS TOML config (the lake root, [redis])")
    p.add_argument("--redis-url", help="default: [redis] url")
    p.add_argument("--prefix", help="default: [redis] prefix")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.config import load_config

    try:
        print(publish_latest(load_config(a.config), a.redis_url, a.prefix))
    except LookupError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
