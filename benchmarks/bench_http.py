"""The lookup's HTTP server under load: the uvicorn server against the standard-library server it
replaced, and plain Redis, in one run, with compiled load generators (wrk, redis-benchmark) so
the client does not eat the server's cores.

    python benchmarks/bench_http.py [--baseline-rev f12b615] [--connections 1 10 50 200] [--seconds 8] [--workers 2]

Both servers serve the same in-memory snapshot (benchmarks/bench_lookup.py's synthetic lake,
d = 32) in this process; the baseline server is the ``lookup/serve.py`` of
``--baseline-rev``, loaded from git. ``python -m lookup.serve --workers N`` runs beside them
as a user runs it, over the same lake. Each request asks for 100 candidates (binary answers); wrk
holds ``--connections`` connections open on 2 threads, so the load is the number of requests in
flight. Plain Redis: ``redis-benchmark`` running ``HMGET`` of the same 100 fields of one hash at
the same concurrency, the floor of any networked store. Needs ``wrk`` and ``redis-server``
(Debian: apt-get install wrk redis-server). Reports requests/s and p50/p99 latency in ms, and
the ratios uvicorn / stdlib.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def baseline_module(rev: str):
    """``lookup/serve.py`` as of ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:lookup/serve.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "serve_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("serve_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrk(url: str, body: str, connections: int, seconds: float) -> dict:
    script = Path(tempfile.mkdtemp()) / "post.lua"
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      'wrk.headers["Accept"] = "application/octet-stream"\n'
                      f"wrk.body = {json.dumps(body)}\n")
    out = subprocess.run(["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
                          f"{url}/v1/lookup"], capture_output=True, text=True, check=True).stdout
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1)),
            "p99": _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1)),
            "errors": sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
            + int((re.search(r"Non-2xx or 3xx responses: (\d+)", out) or [0, 0])[1])}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def redis_benchmark(port: int, fields: list[str], connections: int, requests: int) -> dict:
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(connections), "-n", str(requests), "-q",
                          "--csv", "HMGET", "bench:p:u1", *fields], capture_output=True, text=True, check=True).stdout
    row = next(csv for csv in out.splitlines() if csv.startswith('"HMGET'))
    cols = [c.strip('"') for c in row.split(",")]  # test, rps, avg, min, p50, p95, p99, max
    return {"rps": float(cols[1]), "p50": float(cols[4]), "p99": float(cols[6]), "errors": 0}


def start_workers(lake: Path, workers: int) -> tuple[subprocess.Popen, str]:
    """``python -m lookup.serve`` with ``workers`` processes over the same lake, as a user runs it."""
    from tests.conftest import free_port

    port = free_port()
    cfg = lake / "serve.toml"
    cfg.write_text(f'[lake]\nroot = "{lake}"\n[serve]\nport = {port}\nworkers = {workers}\nallow_client_now = true\n'
                   "record_misses = false\npoll_seconds = 3600\ndim = 32\n")
    proc = subprocess.Popen([sys.executable, "-m", "lookup.serve", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # its log, drained
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    for _ in range(600):  # ready when it answers (the workers' log lines share one pipe)
        if proc.poll() is not None:
            sys.exit(f"lookup.serve --workers {workers} exited {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    sys.exit(f"lookup.serve --workers {workers} did not answer in 60 s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-rev", default="f12b615", help="git revision whose serve.py is the baseline")
    p.add_argument("--connections", type=int, nargs="+", default=[1, 10, 50, 200])
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--users", type=int, default=20000)
    p.add_argument("--workers", type=int, default=2, help="also run `python -m lookup.serve` with this "
                                                           "many workers ([serve] workers; 1: skip)")
    a = p.parse_args(argv)
    for tool in ("wrk", "redis-server", "redis-benchmark"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (Debian: apt-get install wrk redis-server)")

    from bench_lookup import requests, write_lake

    from lookup.online import OnlineStore
    from lookup.server import LookupServer

    tmp = Path(tempfile.mkdtemp(prefix="solaris-http-"))
    redis_proc = workers = None
    try:
        write_lake(tmp / "tables", a.users, 25, 5000)
        store = OnlineStore(tmp / "tables", poll_seconds=3600, record_misses=False).start()
        user, items = requests(a.users, 25, 5000, 100, 1)[0]
        body = json.dumps({"user_id": user, "item_ids": items, "now": "2026-01-05T13:00:00"})
        old = baseline_module(a.baseline_rev)
        servers = {"stdlib (baseline)": old.LookupServer(store, "127.0.0.1", 0, max_items=1000),
                   "uvicorn": LookupServer(store, "127.0.0.1", 0, max_items=1000, allow_client_now=True)}
        for srv in servers.values():
            threading.Thread(target=srv.serve_forever, daemon=True).start()
        workers = start_workers(tmp, a.workers) if a.workers > 1 else None
        if workers:
            servers[f"uvicorn, {a.workers} workers"] = workers[1]
        time.sleep(1)
        port = 6391
        redis_proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        import redis

        r = redis.Redis(port=port)
        r.hset("bench:p:u1", mapping={it: b"x" * 144 for it in items})  # a validity pair + 32 float32 per field
        results = {}
        for c in a.connections:
            for name, srv in servers.items():
                results[(name, c)] = wrk(srv if isinstance(srv, str) else srv.url, body, c, a.seconds)
            rb = results[("stdlib (baseline)", c)]
            results[("plain Redis HMGET", c)] = redis_benchmark(port, items, c, max(2000, int(rb["rps"] * a.seconds)))
        print(f"100 candidates per request, binary answers; wrk -t2 -c<connections> -d{a.seconds:g}s; "
              f"baseline: lookup/serve.py at {a.baseline_rev}")
        print("| connections | server | requests/s | p50 ms | p99 ms | errors | p99 vs stdlib | requests/s vs stdlib |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for c in a.connections:
            base = results[("stdlib (baseline)", c)]
            for name in [*servers, "plain Redis HMGET"]:
                x = results[(name, c)]
                print(f"| {c} | {name} | {x['rps']:,.0f} | {x['p50']:.2f} | {x['p99']:.2f} | {x['errors']} | "
                      f"{x['p99'] / base['p99']:.2f}x | {x['rps'] / base['rps']:.2f}x |", flush=True)
        for srv in servers.values():
            if not isinstance(srv, str):
                srv.shutdown()
        store.stop()
    finally:
        if workers:
            workers[0].terminate()
            workers[0].wait(30)
        if redis_proc:
            redis_proc.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
