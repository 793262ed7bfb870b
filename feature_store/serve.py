"""HTTP lookup service over the online store.

    python -m feature_store.serve [--config F] [--host 127.0.0.1] [--port 8765]

Endpoints (all on loopback by default):

- ``POST /v1/lookup`` with JSON ``{"user_id": "u1", "item_ids": ["i1", ...], "now": "2026-01-05T10:00:00"}``
  (``now`` optional, UTC; default the clock). Answers JSON ``{"snapshot", "dim", "tiers", "embeddings"}``,
  or with ``Accept: application/octet-stream`` a compact binary body (``feature_store.wire.encode_binary``).
- ``GET /healthz`` (the process answers), ``GET /readyz`` (503 until a published snapshot is loaded),
  ``GET /metrics`` (Prometheus text: requests by status, latency histogram, tiers served, snapshot
  version and age, misses, reloads), ``GET /v1/status`` (the same as JSON).

Limits: ``--max-items`` per request (413 above), ``--max-body-bytes`` (413). Malformed JSON, a
missing or non-string user id, non-string item ids, and ids that cannot be stored
(``feature_store/ids.py``: empty, over 256 characters, control characters, lone surrogates) get
400 with the reason. Unknown users and
items are answered (tier ``none``); duplicate items are answered per position.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from feature_store.ids import id_problem
from feature_store.resolution import TIERS
from feature_store.wire import BINARY_TYPE, encode_binary

log = logging.getLogger("solaris.serve")

LATENCY_BUCKETS_MS = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, max_items: int, allow_now: bool = False) -> tuple[str, list[str], datetime | None]:
    """(user_id, item_ids, now) of a lookup body, or ``BadRequest`` with the reason. ``now`` (the time
    to resolve at) is accepted only with ``allow_now``, the operator's ``[serve] allow_client_now``."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"malformed JSON: {e}") from e
    if not isinstance(req, dict):
        raise BadRequest(400, "the body must be a JSON object with user_id and item_ids")
    user, items = req.get("user_id"), req.get("item_ids")
    if not isinstance(user, str) or not user:
        raise BadRequest(400, "user_id must be a non-empty string")
    if (problem := id_problem(user)) is not None:
        raise BadRequest(400, f"user_id {problem}")
    if not isinstance(items, list):
        raise BadRequest(400, "item_ids must be a list of strings")
    if len(items) > max_items:
        raise BadRequest(413, f"too many items: {len(items)} > {max_items} per request")
    bad = next((i for i, x in enumerate(items) if not isinstance(x, str)), None)
    if bad is not None:
        raise BadRequest(400, f"item_ids[{bad}] is {type(items[bad]).__name__}, not a string")
    for i, item in enumerate(items):
        if (problem := id_problem(item)) is not None:
            raise BadRequest(400, f"item_ids[{i}] {problem}")
    now = req.get("now")
    if now is not None and not allow_now:
        raise BadRequest(400, "now is accepted only where the operator allows it ([serve] allow_client_now, for "
                              "replays); leave it out to resolve at the server's clock")
    if now is not None:
        try:
            from include.cli import parse_time

            now = parse_time(now)
        except ValueError as e:
            raise BadRequest(400, str(e)) from e
    return user, items, now


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[int, int] = {}
        self.latency = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.latency_sum_ms = 0.0
        self.tiers = [0] * len(TIERS)

    def observe(self, status: int, ms: float, tiers: np.ndarray | None = None) -> None:
        counts = np.bincount(tiers, minlength=len(TIERS)) if tiers is not None and len(tiers) else None
        with self._lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            self.latency[next((i for i, b in enumerate(LATENCY_BUCKETS_MS) if ms <= b), len(LATENCY_BUCKETS_MS))] += 1
            self.latency_sum_ms += ms
            if counts is not None:
                for i, c in enumerate(counts):
                    self.tiers[i] += int(c)

    def prometheus(self, status: dict) -> str:
        with self._lock:
            lines = ["# TYPE solaris_lookup_requests_total counter"]
            lines += [f'solaris_lookup_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
            lines.append("# TYPE solaris_lookup_latency_ms histogram")
            cum = 0
            for b, n in zip(LATENCY_BUCKETS_MS, self.latency):
                cum += n
                lines.append(f'solaris_lookup_latency_ms_bucket{{le="{b}"}} {cum}')
            cum += self.latency[-1]
            lines += [f'solaris_lookup_latency_ms_bucket{{le="+Inf"}} {cum}',
                      f"solaris_lookup_latency_ms_sum {self.latency_sum_ms:.3f}", f"solaris_lookup_latency_ms_count {cum}",
                      "# TYPE solaris_lookup_pairs_total counter"]
            lines += [f'solaris_lookup_pairs_total{{tier="{t}"}} {n}' for t, n in zip(TIERS, self.tiers)]
        misses = status.get("misses") or {}
        lines += [f"solaris_snapshot_ready {int(status['ready'])}",
                  f'solaris_snapshot_info{{run_id="{status["snapshot_run_id"] or ""}"}} 1',
                  f"solaris_snapshot_age_seconds {status['snapshot_loaded_seconds_ago']}",
                  f"solaris_snapshot_pairs {status['snapshot_stats'].get('pairs', 0)}",
                  f"solaris_snapshot_reloads_total {status['reloads']}",
                  f"solaris_snapshot_reload_failures_total {status['reload_failures']}"]
        lines += [f"solaris_misses_{k}_total {v}" for k, v in misses.items() if k not in ("buffered", "last_error")]
        if "buffered" in misses:
            lines.append(f"solaris_misses_buffered {misses['buffered']}")
        return "\n".join(lines) + "\n"


def make_handler(store, metrics: Metrics, max_items: int, max_body_bytes: int, allow_client_now: bool = False):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
        # Headers and body go out in separate writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms on Linux) on every kept-alive request.
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):  # requests are counted in /metrics, not logged one by one
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json", headers=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj) -> None:
            self._send(status, json.dumps(obj).encode())

        def do_GET(self):
            if self.path == "/healthz":
                return self._json(200, {"ok": True})
            status = store.status()
            if self.path == "/readyz":
                older = status.get("serving_older_publication")
                return self._json(200 if status["ready"] else 503,
                                  {"ready": status["ready"], "snapshot": status["snapshot_run_id"],
                                   "newest_publication": status.get("newest_publication"),
                                   "reason": (f"serving an older snapshot: newer publications failed to load "
                                              f"({', '.join(sorted(status.get('skipped_publications', {})))})")
                                   if older else None if status["ready"] else
                                   (status["last_error"] or "no published snapshot yet")})
            if self.path == "/metrics":
                return self._send(200, metrics.prometheus(status).encode(), "text/plain; version=0.0.4")
            if self.path == "/v1/status":
                return self._json(200, status)
            return self._json(404, {"error": f"no such path {self.path}"})

        def do_POST(self):
            started = time.perf_counter()
            tiers = None
            try:
                length = self.headers.get("Content-Length")
                if length is None or not length.isdigit():
                    self.close_connection = True  # where the body ends is unknown: the connection cannot be reused
                    raise BadRequest(411, "Content-Length is required")
                if int(length) > max_body_bytes:
                    self.close_connection = True  # the body is not read: the connection cannot be reused
                    raise BadRequest(413, f"body of {length} bytes is over the {max_body_bytes}-byte limit")
                body = self.rfile.read(int(length))  # read before any other answer, so keep-alive stays in step
                if self.path.split("?")[0] != "/v1/lookup":
                    raise BadRequest(404, f"no such path {self.path}")
                user, items, now = parse_request(body, max_items, allow_client_now)
                emb, tiers, run_id = store.lookup(user, items, now)
                headers = [("X-Solaris-Snapshot", run_id or "")]
                if BINARY_TYPE in (self.headers.get("Accept") or "") or self.path.endswith("format=binary"):
                    self._send(200, encode_binary(emb, tiers), BINARY_TYPE, headers)
                else:
                    body = {"snapshot": run_id, "dim": int(emb.shape[1]),
                            "tiers": [TIERS[t] for t in tiers], "embeddings": emb.tolist()}
                    self._send(200, json.dumps(body).encode(), headers=headers)
                status = 200
            except BadRequest as e:
                status = e.status
                self._json(status, {"error": str(e)})
            except Exception as e:  # never let one request take the server down
                logging.getLogger("solaris.serve").exception("lookup failed")
                status = 500
                self._json(500, {"error": f"{type(e).__name__}: {e}"})
            metrics.observe(status, (time.perf_counter() - started) * 1000, tiers)

    return Handler


class LookupServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store, host: str = "127.0.0.1", port: int = 8765, max_items: int = 1000,
                 max_body_bytes: int = 1 << 20, allow_client_now: bool = False):
        self.store, self.metrics = store, Metrics()
        super().__init__((host, port), make_handler(store, self.metrics, max_items, max_body_bytes, allow_client_now))

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def configured_dim(cfg) -> int | None:
    """The embedding size to answer with: ``[serve] dim``, else the configured autoencoder's code
    size, else None (the size the published tables hold)."""
    if cfg.serve.dim:
        return cfg.serve.dim
    try:
        from model.registry import code_dim

        return code_dim(cfg)
    except (FileNotFoundError, OSError, KeyError, ValueError):
        log.warning("no [serve] dim and no autoencoder in the registry: the embedding size is the tables'")
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m feature_store.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="SOLARIS TOML config (the lake root, [serve], [redis]); flags override it")
    p.add_argument("--host", help="default: [serve] host (127.0.0.1)")
    p.add_argument("--port", type=int, help="default: [serve] port (8765)")
    p.add_argument("--poll-seconds", type=float, help="how often to look for a new publication ([serve] poll_seconds)")
    p.add_argument("--max-items", type=int, help="[serve] max_items")
    p.add_argument("--max-body-bytes", type=int, help="[serve] max_body_bytes")
    p.add_argument("--no-record-misses", action="store_true", help="do not append misses to miss_queue")
    p.add_argument("--backend", choices=["embedded", "redis"], help="[serve] backend")
    p.add_argument("--redis-url", help="[redis] url")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from include.config import load_config

    cfg = load_config(a.config)
    flags = {"host": a.host, "port": a.port, "poll_seconds": a.poll_seconds, "max_items": a.max_items,
             "max_body_bytes": a.max_body_bytes, "backend": a.backend,
             "record_misses": False if a.no_record_misses else None}
    cfg = cfg.with_overrides(serve={k: v for k, v in flags.items() if v is not None},
                             redis={"url": a.redis_url} if a.redis_url else {})
    sc = cfg.serve
    if sc.backend == "redis":
        from feature_store.redis_store import RedisStore

        store = RedisStore(cfg.redis.url, prefix=cfg.redis.prefix)
    else:
        from feature_store.online import OnlineStore

        store = OnlineStore(cfg.lake.tables_path, dim=configured_dim(cfg), poll_seconds=sc.poll_seconds,
                            record_misses=sc.record_misses,
                            miss_flush_seconds=sc.miss_flush_seconds).start()
    server = LookupServer(store, sc.host, sc.port, sc.max_items, sc.max_body_bytes, sc.allow_client_now)
    print(f"SOLARIS lookup on {server.url} ({sc.backend}; snapshot {store.status()['snapshot_run_id'] or 'none yet'})",
          flush=True)
    # SIGTERM (docker stop, systemd, Kubernetes) ends the server like Ctrl-C: the miss buffer is flushed.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
