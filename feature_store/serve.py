"""HTTP lookup service over the online store.

    python -m feature_store.serve [--config F] [--host 127.0.0.1] [--port 8765] [--workers N]

Endpoints (all on loopback by default):

- ``POST /v1/lookup`` with JSON ``{"user_id": "u1", "item_ids": ["i1", ...], "now": "2026-01-05T10:00:00"}``
  (``now`` optional, UTC; default the clock). Answers JSON ``{"snapshot", "dim", "tiers", "embeddings"}``,
  or with ``Accept: application/octet-stream`` a compact binary body (``feature_store.wire.encode_binary``).
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
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from feature_store.ids import id_problem
from feature_store.resolution import TIERS
from feature_store.store import StoreUnavailable
from feature_store.wire import BINARY_TYPE, encode_binary

log = logging.getLogger("solaris.serve")

LATENCY_BUCKETS_MS = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, max_items: int, allow_now: bool = False
                  ) -> tuple[str, list[str], datetime | None, str | None, str | None]:
    """(user_id, item_ids, now, code_version, consumer) of a lookup body, or ``BadRequest`` with the
    reason. ``now`` (the time to resolve at) is accepted only with ``allow_now``, the operator's
    ``[serve] allow_client_now``; ``code_version`` or ``consumer`` (optional, not both) say which code
    space the caller's VM reads: the space itself, or the consumer whose promoted SOLARIS VM says it."""
    try:
        req = json.loads(body)
    except RecursionError as e:
        raise BadRequest(400, "malformed JSON: nested too deeply") from e
    except (ValueError, UnicodeDecodeError) as e:  # incl. integers too long to convert
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
        except (ValueError, OverflowError) as e:  # not ISO, or out of the representable range in UTC
            raise BadRequest(400, f"now: {e}") from e
    code_version = req.get("code_version")
    if code_version is not None and (not isinstance(code_version, str) or not code_version or len(code_version) > 200):
        raise BadRequest(400, "code_version must be a non-empty string of at most 200 characters (the code space "
                              "the caller's VM was trained on, as /v1/status reports it)")
    consumer = req.get("consumer")
    if consumer is not None and (not isinstance(consumer, str) or not consumer or id_problem(consumer) is not None):
        raise BadRequest(400, "consumer must be a non-empty id string (a [[models.consumers]] name)")
    if consumer is not None and code_version is not None:
        raise BadRequest(400, "name the consumer or the code_version, not both")
    return user, items, now, code_version, consumer


class Metrics:
    """Requests by status, latency, pairs by tier and evicted connections, as prometheus_client
    counters. Under several workers (``PROMETHEUS_MULTIPROC_DIR`` set before the workers start,
    ``serve_workers`` does it) each process writes its own file and every scrape, from whichever
    worker answers it, sums them all: counters never jump between workers."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()
        self.registry = CollectorRegistry()
        self._requests = Counter("solaris_lookup_requests", "lookups by HTTP status", ["status"],
                                 registry=self.registry)
        self._latency = Histogram("solaris_lookup_latency_ms", "lookup latency (ms)", buckets=LATENCY_BUCKETS_MS,
                                  registry=self.registry)
        self._pairs = Counter("solaris_lookup_pairs", "pairs served by tier", ["tier"], registry=self.registry)
        self._evicted = Counter("solaris_lookup_connections_evicted",
                                "idle connections closed to admit a new one (max_connections reached)",
                                registry=self.registry)
        for tier in TIERS:
            self._pairs.labels(tier)

    def observe(self, status: int, ms: float, tiers: np.ndarray | None = None) -> None:
        self._requests.labels(str(status)).inc()
        self._latency.observe(ms)
        if tiers is not None and len(tiers):
            for tier, n in zip(TIERS, np.bincount(tiers, minlength=len(TIERS))):
                if n:
                    self._pairs.labels(tier).inc(int(n))

    def evicted(self) -> None:
        self._evicted.inc()

    def _collected(self):
        """This process's registry, or the sum over every worker's files."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return self.registry
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return registry

    def counts(self) -> dict:
        """Requests by status and pairs by tier served (every worker's), for ``/v1/status``."""
        requests, pairs, evicted = {}, dict.fromkeys(TIERS, 0), 0
        for metric in self._collected().collect():
            for sample in metric.samples:
                if sample.name == "solaris_lookup_requests_total":
                    requests[sample.labels["status"]] = requests.get(sample.labels["status"], 0) + int(sample.value)
                elif sample.name == "solaris_lookup_pairs_total":
                    pairs[sample.labels["tier"]] = pairs.get(sample.labels["tier"], 0) + int(sample.value)
                elif sample.name == "solaris_lookup_connections_evicted_total":
                    evicted += int(sample.value)
        return {"requests": dict(sorted(requests.items())), "errors": sum(v for k, v in requests.items() if int(k) >= 400),
                "pairs": pairs, "connections_evicted": evicted}

    def prometheus(self, status: dict) -> str:
        """The counters above (every worker's), then this worker's snapshot and miss figures."""
        from prometheus_client import generate_latest

        lines = [generate_latest(self._collected()).decode().rstrip("\n")]
        misses = status.get("misses") or {}
        lines += [f"solaris_snapshot_ready {int(status['ready'])}",
                  f'solaris_snapshot_info{{run_id="{status["snapshot_run_id"] or ""}"}} 1',
                  # the data's age (now - the publication's interval end); the load's age beside it
                  f"solaris_snapshot_age_seconds {status.get('snapshot_data_age_seconds') or 0}",
                  f"solaris_snapshot_loaded_seconds_ago {status['snapshot_loaded_seconds_ago']}",
                  f"solaris_snapshot_pairs {status['snapshot_stats'].get('pairs', 0)}",
                  f"solaris_snapshot_reloads_total {status['reloads']}",
                  f"solaris_snapshot_reload_failures_total {status['reload_failures']}"]
        lines += [f"solaris_misses_{k}_total {v}" for k, v in misses.items() if k not in ("buffered", "last_error")]
        if "buffered" in misses:
            lines.append(f"solaris_misses_buffered {misses['buffered']}")
        return "\n".join(lines) + "\n"


def check_origin(headers) -> None:
    """A lookup body must be declared JSON, and a request a browser sent on behalf of a web page
    (it carries ``Origin``) is refused: a page may POST ``text/plain`` to a loopback address without
    asking first, so without this any site a user opens could query the lookup and queue misses."""
    ctype = next((v for k, v in headers if k == b"content-type"), b"").split(b";")[0].strip().lower()
    if next((v for k, v in headers if k == b"origin"), None) is not None:
        raise BadRequest(403, "requests from web pages (an Origin header) are not served")
    if ctype != b"application/json":
        raise BadRequest(415, f"Content-Type must be application/json, got {ctype.decode('latin-1') or 'none'!r}")


def wants_binary(accept: bytes) -> bool:
    """Whether ``Accept`` prefers the binary body: it names it with a q above 0 and at least the q
    of JSON (``application/octet-stream;q=0`` means "not that")."""
    q = {}
    for part in accept.decode("latin-1").split(","):
        kind, *params = [x.strip() for x in part.split(";")]
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        q[kind.lower()] = max(q.get(kind.lower(), 0.0), weight)
    binary = q.get(BINARY_TYPE, 0.0)
    return binary > 0 and binary >= q.get("application/json", 0.0)


class RequestTooSlow(Exception):
    """The connection was closed because its request did not arrive whole in time."""


async def read_body(scope, receive, max_body_bytes: int) -> bytes:
    """The request body, refused with 411 without a Content-Length (where it ends is unknown) and
    413 above the limit, before a byte of it is read."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if length is None:
        raise BadRequest(411, "Content-Length is required")
    if int(length) > max_body_bytes:  # the HTTP parser has checked it is one decimal number
        raise BadRequest(413, f"body of {int(length)} bytes is over the {max_body_bytes}-byte limit")
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":  # the deadline closed it, or the client went away mid-body
            raise RequestTooSlow()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def respond(send, status: int, body: bytes, content_type: str, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send, status: int, message: str, headers: list | None = None) -> None:
    """The JSON error body every other path answers with (``{"error": ...}``)."""
    await respond(send, status, _dumps({"error": message}), "application/json", headers)


class ConsumerCodeSpaces:
    """Consumer name -> the code space its promoted SOLARIS VM was trained on, from the model registry,
    each re-read at most every ``seconds`` (a promotion is seen within that)."""

    def __init__(self, models_root: str | Path, seconds: float = 5.0):
        self.models_root, self.seconds = Path(models_root), seconds
        self._known: dict[str, tuple[float, str | None, str | None]] = {}  # name -> (read at, space, why not)

    def __call__(self, consumer: str) -> str:
        """Its code space, or ``LookupError`` saying why the registry cannot tell."""
        from model.registry import consumer_code_version

        at, space, why = self._known.get(consumer, (-1e18, None, None))
        if time.monotonic() - at > self.seconds:
            try:
                space, why = consumer_code_version(self.models_root, consumer), None
            except LookupError as e:
                space, why = None, str(e)
            if len(self._known) > 10_000:  # names come from requests: bound what they can make it hold
                self._known.clear()
            self._known[consumer] = (time.monotonic(), space, why)
        if space is None:
            raise LookupError(why)
        return space


def build_app(store, metrics: Metrics, max_items: int = 1000, max_body_bytes: int = 1 << 20,
              allow_client_now: bool = False, consumers: ConsumerCodeSpaces | None = None):
    """The ASGI application: lookup, health, readiness, metrics and status; JSON errors throughout.

    ``POST /v1/lookup``, the hot path, is a bare ASGI handler: Starlette's request and response
    objects and routing cost as much as the lookup itself. Everything else (and every other method
    on /v1/lookup: 405) goes through Starlette."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str, **headers) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers or None)

    # A store that waits on the network (Redis) is called from a worker thread, so one that hangs
    # holds a thread for its timeout, not the event loop that /healthz and every other request need.
    if getattr(store, "blocking", False):
        from anyio import to_thread

        async def call(fn, *args):
            return await to_thread.run_sync(fn, *args)
    else:
        async def call(fn, *args):
            return fn(*args)

    async def lookup(scope, receive, send):
        started = time.perf_counter()
        tiers, status = None, 200
        try:
            check_origin(scope["headers"])
            body = await read_body(scope, receive, max_body_bytes)
            user, items, now, code_version, consumer = parse_request(body, max_items, allow_client_now)
            if consumer is not None:
                if consumers is None:
                    raise BadRequest(400, "this lookup runs without a model registry: name the code_version instead "
                                          "of the consumer")
                try:
                    code_version = consumers(consumer)
                except LookupError as e:
                    raise BadRequest(422, str(e)) from e
            emb, tiers, run_id = await call(store.lookup, user, items, now, code_version)
            served_space = store.answer_space(run_id, code_version)  # the code space of the answer: a caller can check it
            headers = [(b"x-solaris-snapshot", (run_id or "").encode()),
                       (b"x-solaris-code-version", (served_space or "").encode())]
            accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
            if wants_binary(accept) or b"format=binary" in scope.get("query_string", b"").split(b"&"):
                await respond(send, 200, encode_binary(emb, tiers), BINARY_TYPE, headers)
            else:
                await respond(send, 200, _dumps({"snapshot": run_id, "code_version": served_space,
                                                 "dim": int(emb.shape[1]),
                                                 "tiers": [TIERS[t] for t in tiers], "embeddings": emb.tolist()}),
                              "application/json", headers)
        except BadRequest as e:
            status = e.status
            await respond_error(send, status, str(e))
        except RequestTooSlow:
            status = 408  # nobody is left to read an answer
        except StoreUnavailable as e:  # degraded: say so and when to come back, rather than fail obscurely
            status = 503
            await respond_error(send, 503, str(e), [(b"retry-after", b"1")])
        except Exception as e:  # never let one request take the server down
            log.exception("lookup failed")
            status = 500
            await respond_error(send, 500, f"{type(e).__name__}: {e}")
        metrics.observe(status, (time.perf_counter() - started) * 1000, tiers)

    async def healthz(request):
        return JSONResponse({"ok": True})

    async def readyz(request):
        status = await call(store.status)
        older = status.get("serving_older_publication")
        reason = (f"serving an older snapshot: newer publications failed to load "
                  f"({', '.join(sorted(status.get('skipped_publications', {})))})" if older else
                  None if status["ready"] else (status["last_error"] or "no published snapshot yet"))
        return JSONResponse({"ready": status["ready"], "snapshot": status["snapshot_run_id"],
                             "newest_publication": status.get("newest_publication"), "reason": reason},
                            status_code=200 if status["ready"] else 503)

    async def prometheus(request):
        return Response(metrics.prometheus(await call(store.status)), media_type="text/plain; version=0.0.4")

    async def status(request):
        return JSONResponse({**(await call(store.status)), **metrics.counts(), "pid": os.getpid()})  # which worker answered

    async def http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            return error(404, f"no such path {request.url.path}")
        return error(exc.status_code, exc.detail, **(exc.headers or {}))

    async def not_allowed(request):  # /v1/lookup with any method but POST (POST never gets here)
        return error(405, "Method Not Allowed", Allow="POST")

    routes = [Route("/v1/lookup", not_allowed, methods=["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]),
              Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"]),
              Route("/metrics", prometheus, methods=["GET"]),
              Route("/v1/status", status, methods=["GET"])]  # GET routes answer HEAD too
    rest = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    # No redirect from "/path/" to "/path": Starlette builds it from the Host header, which a client
    # sets; an unknown path is a 404.
    rest.router.redirect_slashes = False

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/lookup":
            await lookup(scope, receive, send)
        else:
            await rest(scope, receive, send)

    return app


# Bounds on a request's head, checked on the raw bytes before the parser sees them: the parser
# (and uvicorn's URL accumulation) would otherwise keep growing buffers for a client that streams
# an endless request line or header, burning a worker's CPU while every other client waits.
MAX_REQUEST_LINE = 8192  # bytes of "METHOD URL HTTP/1.1": 414 beyond it
MAX_HEADER_LINE = 8192  # bytes of one header line: 431 beyond it
MAX_HEADERS = 100  # header lines per request: 431 beyond it
HEAD_REFUSALS = {414: (b"414 URI Too Long", "request line over {} bytes".format(MAX_REQUEST_LINE)),
                 431: (b"431 Request Header Fields Too Large",
                       f"a header line over {MAX_HEADER_LINE} bytes or more than {MAX_HEADERS} headers")}


class HeadLimits:
    """Line lengths and count of one request head, fed the raw bytes as they arrive; ``feed``
    returns the status to refuse with (414, 431) or None. Linear in the bytes: each byte is looked
    at once, whatever the chunking."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.in_head, self.lines, self.line = True, 0, 0

    @property
    def started(self) -> bool:
        """Bytes of a request head have arrived."""
        return self.lines > 0 or self.line > 0

    def feed(self, data: bytes) -> int | None:
        pos = 0
        while self.in_head:
            nl = data.find(b"\n", pos)
            if nl < 0:
                self.line += len(data) - pos
                return self._over(self.line)
            length, pos, self.line = self.line + nl - pos, nl + 1, 0
            if length <= 1:  # "\r\n": a blank line ends the head; before the request line it is skipped
                self.in_head = self.lines == 0
                continue
            self.lines += 1
            over = self._over(length)
            if over or self.lines > MAX_HEADERS + 1:
                return over or 431
        return None

    def _over(self, length: int) -> int | None:
        if self.lines == 0:
            return 414 if length > MAX_REQUEST_LINE else None
        return 431 if length > MAX_HEADER_LINE else None


# At shutdown an idle kept-alive connection stays open this long: a request its client sent just
# before it saw the close is answered (with "Connection: close") instead of reset.
DRAIN_SECONDS = 1.0


def deadline_protocol(request_timeout: float, max_connections: int | None = None, metrics: "Metrics | None" = None,
                      drain_seconds: float = DRAIN_SECONDS):
    """uvicorn's httptools protocol with a deadline on every request: from a connection's first byte
    (and from each kept-alive request's first byte) to its last, at most ``request_timeout``
    seconds, or the connection is closed. Slow headers, a body shorter than its Content-Length, a
    TLS hello on the plain port or a silent connection then cost a socket for seconds, not for ever;
    an idle kept-alive connection is closed by uvicorn's keep-alive timeout.

    At most ``max_connections`` connections: a new one beyond it closes the connection that has
    been idle longest (no request of it in the app: kept alive between requests, or still sending
    its head), so sockets held open and silent cannot lock every client out; only when every
    connection has a request in the app is the new one answered 503 (counted in ``metrics``).

    At shutdown no request that reached the connection is reset: an idle connection is closed
    after ``drain_seconds`` (or after answering a request that arrives meanwhile), a busy one after
    answering the last request it received; that answer says "Connection: close"."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline = None
        _draining = False

        def connection_made(self, transport):
            super().connection_made(transport)
            self._limits = HeadLimits()
            self._active_at = self.loop.time()
            self._arm()
            if max_connections is not None and len(self.connections) > max_connections:
                self._make_room()

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _make_room(self):
            idle = [c for c in self.connections if c is not self and c._idle() and not c.transport.is_closing()]
            if idle:
                oldest = min(idle, key=lambda c: c._active_at)
                oldest.connections.discard(oldest)  # gone now, not when its close completes
                oldest.transport.close()
                if metrics is not None:
                    metrics.evicted()
                return
            self._refuse(b"503 Service Unavailable",
                         f"every one of the {max_connections} connections has a request in progress")
            if metrics is not None:
                metrics.observe(503, 0.0)

        def data_received(self, data):
            self._active_at = self.loop.time()
            refuse = self._limits.feed(data) if self._limits.in_head else None
            if refuse is None:
                super().data_received(data)
                return
            self._refuse(*HEAD_REFUSALS[refuse])

        def _refuse(self, status: bytes, message: str):
            """Answer ``status`` with a JSON error and close, before the HTTP parser or the app."""
            body = _dumps({"error": message})
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.transport.close()

        def _arm(self):
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout, self._expired)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self):
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def on_message_begin(self):
            self._arm()
            super().on_message_begin()

        def on_message_complete(self):
            self._disarm()
            self._limits.reset()  # a kept-alive connection's next request has a head of its own
            super().on_message_complete()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def shutdown(self):
            self._draining = True
            if not self._idle():
                # the last request received (self.cycle, pipelined or not) closes it once answered
                self.cycle.keep_alive = False
            elif not self.transport.is_closing():
                self.loop.call_later(drain_seconds, self._close_if_idle)

        def _close_if_idle(self):
            # a request whose head has begun is answered (or closed at its deadline)
            if self._idle() and not self._limits.started and not self.transport.is_closing():
                self.transport.close()

        def on_headers_complete(self):
            super().on_headers_complete()
            if self._draining:  # a request that arrived during the drain: answered, then closed
                self.cycle.keep_alive = False

    return DeadlineProtocol


def listening_socket(host: str, port: int, backlog: int):
    """Bound now, so the port (0: any free one) is known at once, and listening: connections wait in
    the backlog until uvicorn runs."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


class LookupServer:
    """The lookup app under uvicorn (asyncio, httptools' C parser): bounded backlog and connection
    count (503 beyond it), a deadline per request, a keep-alive timeout and a graceful shutdown
    that lets requests in flight finish. ``serve_forever`` runs it (in the main thread it also
    handles SIGTERM and Ctrl-C); ``shutdown`` stops it from another thread."""

    def __init__(self, store, host: str = "127.0.0.1", port: int = 8765, max_items: int = 1000,
                 max_body_bytes: int = 1 << 20, allow_client_now: bool = False, request_timeout: float = 10.0,
                 keepalive_seconds: int = 5, max_connections: int = 1000, backlog: int = 2048, sock=None,
                 consumers: ConsumerCodeSpaces | None = None):
        import uvicorn

        self.store, self.metrics = store, Metrics()
        app = build_app(store, self.metrics, max_items, max_body_bytes, allow_client_now, consumers)
        # A socket given is one that a parent bound and shares among its workers (serve_workers).
        self.socket = sock if sock is not None else listening_socket(host, port, backlog)
        config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning", server_header=False,
                                http=deadline_protocol(request_timeout, max_connections, self.metrics), backlog=backlog,
                                timeout_keep_alive=keepalive_seconds,
                                timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        self._done = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self._done.set()

    def shutdown(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self._done.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()


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
        from feature_store.redis_store import RedisStore

        return RedisStore(cfg.redis.url, prefix=cfg.redis.prefix, dim=dim)
    from feature_store.online import OnlineStore

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
