"""HTTP lookup service over the online store.

    python -m lookup.serve [--config F] [--host 127.0.0.1] [--port 8765] [--workers N]

Endpoints (all on loopback by default):

- ``POST /v1/lookup`` with JSON ``{"user_id": "u1", "item_ids": ["i1", ...], "now": "2026-01-05T10:00:00"}``
  (``now`` optional, UTC; default the clock). Answers JSON ``{"snapshot", "dim", "tiers", "embeddings"}``,
  or with ``Accept: application/octet-stream`` a compact binary body (``lookup.wire.encode_binary``).
- ``GET /healthz`` (the process answers), ``GET /readyz`` (503 until a published snapshot is loaded),
  ``GET /metrics`` (Prometheus text: requests by status, latency histogram, tiers served, snapshot
  version and age, misses, reloads), ``GET /v1/status`` (the same as JSON).

Limits: ``--max-items`` per request (413 above), ``--max-body-bytes`` (413). Malformed JSON (also
nested too deeply, or integers too long), a missing or non-string user id, non-string item ids,
ids that cannot be stored (``feature_store/ids.py``: empty, over 256 characters, control
characters, lone surrogates) and a ``now`` that is not an ISO time in range get 400 with the
reason; ``now`` at all only where ``[serve] allow_client_now`` is on. Unknown users and items are
answered (tier ``none``); duplicate items are answered per position.

The server is uvicorn (asyncio; httptools' C parser, which refuses malformed, duplicated or
conflicting Content-Length and Transfer-Encoding headers with 400) running a starlette app, with a
bounded listen backlog, at most ``[serve] max_connections`` connections (a new one beyond closes
the connection idle longest; 503 only when every connection has a request in progress), a deadline
per request (``request_timeout_seconds``: headers and body must arrive whole in time, or the
connection is closed and nothing of it is processed), a keep-alive timeout and a graceful shutdown
on SIGTERM or Ctrl-C that finishes requests in flight and then flushes the buffered misses.
``[serve] workers`` forks that many such processes on the one listening socket (``serve_workers``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile

from lookup.app import ConsumerCodeSpaces
from lookup.server import LookupServer, listening_socket

log = logging.getLogger("solaris.serve")


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
    p = argparse.ArgumentParser(prog="python -m lookup.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="SOLARIS TOML config (the lake root, [serve], [redis]); flags override it")
    p.add_argument("--host", help="default: [serve] host (127.0.0.1)")
    p.add_argument("--port", type=int, help="default: [serve] port (8765)")
    p.add_argument("--poll-seconds", type=float, help="how often to look for a new publication ([serve] poll_seconds)")
    p.add_argument("--max-items", type=int, help="[serve] max_items")
    p.add_argument("--max-body-bytes", type=int, help="[serve] max_body_bytes")
    p.add_argument("--no-record-misses", action="store_true", help="do not append misses to miss_queue")
    p.add_argument("--backend", choices=["embedded", "redis"], help="[serve] backend")
    p.add_argument("--workers", type=int, help="[serve] workers: server processes sharing the port")
    p.add_argument("--redis-url", help="[redis] url")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from include.config import load_config

    cfg = load_config(a.config)
    flags = {"host": a.host, "port": a.port, "poll_seconds": a.poll_seconds, "max_items": a.max_items,
             "max_body_bytes": a.max_body_bytes, "backend": a.backend, "workers": a.workers,
             "record_misses": False if a.no_record_misses else None}
    cfg = cfg.with_overrides(serve={k: v for k, v in flags.items() if v is not None},
                             redis={"url": a.redis_url} if a.redis_url else {})
    sc = cfg.serve
    dim = configured_dim(cfg)
    sock = listening_socket(sc.host, sc.port, sc.backlog)
    if sc.workers == 1:
        return serve_one(cfg, dim, sock)
    return serve_workers(cfg, dim, sock, sc.workers)


def open_store(cfg, dim: int | None):
    sc = cfg.serve
    if sc.backend == "redis":
        from lookup.redis_store import RedisStore

        return RedisStore(cfg.redis.url, prefix=cfg.redis.prefix, dim=dim)
    from lookup.online import OnlineStore

    return OnlineStore(cfg.lake.tables_path, dim=dim, poll_seconds=sc.poll_seconds, record_misses=sc.record_misses,
                       miss_flush_seconds=sc.miss_flush_seconds, miss_per_user=sc.miss_per_user).start()


def serve_one(cfg, dim: int | None, sock, worker: str = "") -> int:
    """One server process on ``sock`` until SIGTERM or Ctrl-C; then its buffered misses are flushed."""
    sc = cfg.serve
    store = open_store(cfg, dim)
    server = LookupServer(store, sc.host, sc.port, sc.max_items, sc.max_body_bytes, sc.allow_client_now,
                          sc.request_timeout_seconds, sc.keepalive_seconds, sc.max_connections, sc.backlog, sock=sock,
                          consumers=ConsumerCodeSpaces(cfg.models_root, sc.poll_seconds))
    print(f"SOLARIS lookup{worker} on {server.url} ({sc.backend}; snapshot "
          f"{store.status()['snapshot_run_id'] or 'none yet'})", flush=True)
    # uvicorn handles SIGTERM (docker stop, systemd, Kubernetes) and Ctrl-C while it runs, finishes the
    # requests in flight, then re-raises the signal under the handler that was there before it: this
    # one, so that the process goes on to flush the buffered misses instead of dying at once.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.stop()  # flushes the buffered misses
    return 0


def serve_workers(cfg, dim: int | None, sock, workers: int) -> int:
    """``workers`` forked processes accepting on one listening socket, each with its own store (its
    own snapshot in memory, poller and miss flusher): one Python process tops out near one core.
    The parent only waits: SIGTERM or Ctrl-C goes to every worker, which finishes its requests and
    flushes its misses. A worker that dies stops the others, and the parent exits non-zero, so the
    process manager (systemd, Kubernetes, compose) restarts the whole server rather than it running
    short-handed unnoticed."""
    metrics_dir = shared_metrics_dir()
    children: list[int] = []
    for n in range(workers):
        pid = os.fork()  # before any thread or store exists in this process: nothing to copy half-locked
        if pid == 0:
            code = 1
            try:
                die_with_parent()
                signal.signal(signal.SIGINT, signal.default_int_handler)
                code = serve_one(cfg, dim, sock, worker=f" worker {n + 1}/{workers} (pid {os.getpid()})")
            except BaseException:  # noqa: BLE001 - report it; the parent sees the exit code
                log.exception("worker %d failed", n + 1)
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()  # the workers hold it

    def forward(signum, _frame):
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    stopping = []

    def stop(signum, frame):
        stopping.append(signum)
        forward(signum, frame)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while children:
        pid, code = os.wait()
        children.remove(pid)
        code = os.waitstatus_to_exitcode(code)
        # Any worker that ends while no stop was asked for (even with 0) leaves the server short-handed.
        if not stopping and status == 0:
            log.error("worker pid %d exited with %d while serving: stopping the others", pid, code)
            status = 1
            forward(signal.SIGTERM, None)
        elif code != 0 and status == 0:
            status = 1
    if metrics_dir is not None:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return status


def shared_metrics_dir() -> str | None:
    """Before the workers fork: a fresh folder where each worker's prometheus_client counters live,
    so that any worker's /metrics and /v1/status sum them all. Returns it (removed at exit), or None
    where the operator set ``PROMETHEUS_MULTIPROC_DIR`` (theirs to keep and to empty between runs)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path = tempfile.mkdtemp(prefix="solaris-lookup-metrics-")
    if "prometheus_client.values" in sys.modules:  # imported before the variable was set: switch it now
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
    return path


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies, even by SIGKILL, so no worker is left
    holding the port with nobody to restart or stop it. Elsewhere nothing."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the call: go now
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
