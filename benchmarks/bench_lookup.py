"""Online lookup: in-process and HTTP latency, memory per pair, and plain Redis beside it, in one run.

    python benchmarks/bench_lookup.py [--users 20000] [--pairs-per-user 25] [--seconds 8]

Writes a synthetic snapshot (d = 32) as real Delta tables with delta-rs and publishes it, then:

1. in-process ``OnlineStore.lookup`` p50/p99 for 1, 100 and 500 candidates, and the snapshot's
   bytes per stored pair against the raw embedding bytes (4 * d);
2. the same lookups through ``RedisStore`` (the Redis backend, publish step included) and, as the
   established-store baseline, plain Redis ``HMGET`` of the same fields with no decoding;
3. HTTP (binary answers) p50/p99 and requests/s for 100 and 500 candidates under concurrent load
   from a second process on loopback.

Candidates per request: a third from the user's stored pairs, the rest items it has none for, so
every tier is exercised. Ratios are against plain Redis HMGET measured in this run. Needs
redis-server on PATH for parts 2 (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
T = datetime(2026, 1, 5, 12)
DIM = 32


def write_lake(root: Path, users: int, per_user: int, items: int, seed: int = 0) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(seed)
    ts = pa.timestamp("us", tz="UTC")
    n = users * per_user
    u = np.repeat(np.arange(users), per_user)
    it = (u * 7919 + np.tile(np.arange(per_user), users) * 104729) % items
    emb = rng.standard_normal((n, DIM)).astype(np.float32)
    flat = pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), DIM).cast(pa.list_(pa.float32()))
    write_deltalake(str(root / "pair_embeddings"), pa.table({
        "user_id": pa.array([f"u{x}" for x in u]), "item_id": pa.array([f"i{x}" for x in it]), "embedding": flat,
        "model_version": pa.array(["bench"] * n), "computed_at": pa.array([T] * n, ts),
        "expires_at": pa.array([T + timedelta(hours=6)] * n, ts), "run_id": pa.array(["bench"] * n)}))
    means = rng.standard_normal((users, DIM)).astype(np.float32)
    has_mean = np.arange(users) % 2 == 0  # half the users have a mean; the rest exercise the neighbor tier
    mu = np.flatnonzero(has_mean)
    write_deltalake(str(root / "user_mean_embeddings"), pa.table({
        "user_id": pa.array([f"u{x}" for x in mu]),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(means[mu].ravel()), DIM).cast(pa.list_(pa.float32())),
        "pair_count": pa.array([per_user] * len(mu), pa.int64()), "window_start": pa.array([T] * len(mu), ts),
        "computed_at": pa.array([T] * len(mu), ts), "expires_at": pa.array([T + timedelta(hours=6)] * len(mu), ts),
        "run_id": pa.array(["bench"] * len(mu))}))
    nu = np.flatnonzero(~has_mean)
    k = 10
    nb = mu[rng.integers(0, len(mu), (len(nu), k))]
    write_deltalake(str(root / "user_neighbors"), pa.table({
        "user_id": pa.array([f"u{x}" for x in np.repeat(nu, k)]), "rank": pa.array(np.tile(np.arange(1, k + 1), len(nu)), pa.int32()),
        "neighbor_id": pa.array([f"u{x}" for x in nb.ravel()]),
        "similarity": pa.array(rng.uniform(0.2, 0.9, len(nu) * k).astype(np.float32)),
        "index_kind": pa.array(["IndexFlatIP"] * (len(nu) * k)), "computed_at": pa.array([T] * (len(nu) * k), ts),
        "expires_at": pa.array([T + timedelta(hours=24)] * (len(nu) * k), ts), "run_id": pa.array(["bench"] * (len(nu) * k))}))
    write_deltalake(str(root / "feature_versions"), pa.table({
        "run_id": ["bench"], "interval_end": pa.array([T], ts), "pair_embeddings_version": pa.array([0], pa.int64()),
        "user_mean_embeddings_version": pa.array([0], pa.int64()), "user_neighbors_version": pa.array([0], pa.int64()),
        "published_at": pa.array([T], ts)}))


def requests(users: int, per_user: int, items: int, n: int, count: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        u = int(rng.integers(0, users))
        own = [f"i{(u * 7919 + j * 104729) % items}" for j in range(per_user)]
        pick = [own[j] for j in rng.integers(0, per_user, max(n // 3, 1 if n < 3 else 0))]
        rest = [f"i{x}" for x in rng.integers(0, items, n - len(pick))]
        out.append((f"u{u}", (pick + rest)[:n]))
    return out


def percentiles(ms: list[float]) -> tuple[float, float]:
    a = np.asarray(ms)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def time_calls(fn, reqs, now) -> list[float]:
    for user, items in reqs[:20]:  # warm-up
        fn(user, items, now)
    out = []
    for user, items in reqs:
        t0 = time.perf_counter()
        fn(user, items, now)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def load_client(url: str, n: int, seconds: float, concurrency: int, users: int, per_user: int, items: int) -> dict:
    """Runs in the second process: ``concurrency`` threads, each with its own kept-alive connection."""
    from lookup.client import LookupClient

    reqs = requests(users, per_user, items, n, 2000, seed=7)
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker(offset: int):
        mine = []
        with LookupClient(url) as c:
            i = offset
            while time.perf_counter() < stop:
                user, its = reqs[i % len(reqs)]
                t0 = time.perf_counter()
                c.lookup(user, its, T + timedelta(hours=1))
                mine.append((time.perf_counter() - t0) * 1000)
                i += concurrency
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(j,)) for j in range(concurrency)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    p50, p99 = percentiles(lat)
    return {"requests": len(lat), "seconds": time.perf_counter() - t0, "p50": p50, "p99": p99}


def start_redis():
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    import redis

    r = redis.Redis(port=port)
    for _ in range(200):
        try:
            r.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--pairs-per-user", type=int, default=25)
    p.add_argument("--items", type=int, default=50_000)
    p.add_argument("--calls", type=int, default=400, help="timed in-process calls per size")
    p.add_argument("--seconds", type=float, default=8.0, help="HTTP load per size")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--load-client", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.load_client:
        print(json.dumps(load_client(a.load_client, a.n, a.seconds, a.concurrency, a.users, a.pairs_per_user, a.items)))
        return 0

    from lookup.online import OnlineStore
    from lookup.server import LookupServer

    tmp = Path(tempfile.mkdtemp(prefix="bench_lookup_"))
    try:
        t0 = time.perf_counter()
        write_lake(tmp / "tables", a.users, a.pairs_per_user, a.items)
        print(f"lake: {a.users:,} users x {a.pairs_per_user} pairs = {a.users * a.pairs_per_user:,} pairs, d={DIM} "
              f"(written in {time.perf_counter() - t0:.1f} s)")
        t0 = time.perf_counter()
        store = OnlineStore(tmp / "tables", poll_seconds=3600, record_misses=False).start()
        snap = store.snapshot
        print(f"snapshot load: {time.perf_counter() - t0:.2f} s; {snap.stats}")
        pair_bytes = snap.pair_keys.nbytes + snap.pair_embedding.nbytes + snap.pair_valid.nbytes
        per_pair = pair_bytes / max(len(snap.pair_keys), 1)
        print(f"memory: {per_pair:.0f} bytes per stored pair (key 8 + embedding {4 * DIM} + validity 16) "
              f"vs {4 * DIM} raw embedding bytes = {per_pair / (4 * DIM):.2f}x; "
              f"user/item id index and per-user arrays: "
              f"{(snap.mean_embedding.nbytes + snap.mean_valid.nbytes + snap.neighbor_ids.nbytes + snap.neighbor_similarity.nbytes) / 1e6:.1f} MB")
        now = T + timedelta(hours=1)
        rows = []
        redis_proc, url = start_redis()
        rstore = raw = None
        if url:
            import redis

            from lookup.redis_store import RedisStore, publish

            t0 = time.perf_counter()
            counts = publish(snap, redis.Redis.from_url(url))
            print(f"redis publish: {time.perf_counter() - t0:.1f} s, {counts}")
            rstore = RedisStore(url)
            raw = redis.Redis.from_url(url)
            ns = counts["namespace"]
        for n in (1, 100, 500):
            reqs = requests(a.users, a.pairs_per_user, a.items, n, a.calls)
            emb_ms = time_calls(store.lookup, reqs, now)
            row = {"n": n, "embedded": percentiles(emb_ms)}
            if rstore:
                row["redis_store"] = percentiles(time_calls(rstore.lookup, reqs, now))
                row["redis_hmget"] = percentiles(time_calls(lambda u, its, _: raw.hmget(f"{ns}:p:{u}", its), reqs, now))
            rows.append(row)
        print("\nIn-process lookup, ms (p50 / p99); ratio = p99 against plain Redis HMGET of the same fields")
        print("| candidates | embedded snapshot | SOLARIS on Redis | plain Redis HMGET | embedded / HMGET | SOLARIS-Redis / HMGET |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            e, s, h = r["embedded"], r.get("redis_store"), r.get("redis_hmget")
            fmt = lambda x: f"{x[0]:.3f} / {x[1]:.3f}" if x else "n/a"  # noqa: E731
            print(f"| {r['n']} | {fmt(e)} | {fmt(s)} | {fmt(h)} | "
                  f"{(e[1] / h[1]) if h else float('nan'):.2f}x | {(s[1] / h[1]) if h else float('nan'):.2f}x |")

        srv = LookupServer(store, "127.0.0.1", 0, max_items=1000, allow_client_now=True)  # replays a fixed hour
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        print(f"\nHTTP (binary answers), {a.concurrency} client threads in a second process, {a.seconds:.0f} s each; "
              f"server and client share the machine's {os.cpu_count()} cores")
        print("| candidates | requests | requests/s | p50 ms | p99 ms |")
        print("|---:|---:|---:|---:|---:|")
        for n in (100, 500):
            out = subprocess.run([sys.executable, __file__, "--load-client", srv.url, "--n", str(n),
                                  "--seconds", str(a.seconds), "--concurrency", str(a.concurrency),
                                  "--users", str(a.users), "--pairs-per-user", str(a.pairs_per_user),
                                  "--items", str(a.items)], capture_output=True, text=True, cwd=ROOT, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {n} | {res['requests']:,} | {res['requests'] / res['seconds']:,.0f} | {res['p50']:.2f} | {res['p99']:.2f} |")
        srv.shutdown()
        srv.server_close()
        store.stop()
        if redis_proc:
            redis_proc.terminate()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
