"""The ASGI application of the lookup: ``POST /v1/lookup`` as a bare handler (the hot path), health,
readiness, metrics and status through Starlette; JSON errors throughout."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from feature_store.resolution import TIERS
from lookup.metrics import Metrics
from lookup.request import BadRequest, check_origin, parse_request, wants_binary
from lookup.store import StoreUnavailable
from lookup.wire import BINARY_TYPE, encode_binary

log = logging.getLogger("solaris.serve")


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


def json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def respond(send, status: int, body: bytes, content_type: str, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send, status: int, message: str, headers: list | None = None) -> None:
    """The JSON error body every other path answers with (``{"error": ...}``)."""
    await respond(send, status, json_bytes({"error": message}), "application/json", headers)


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


def store_caller(store):
    """``await call(fn, *args)`` for the store's methods. A store that waits on the network (Redis) is
    called from a worker thread, so one that hangs holds a thread for its timeout, not the event loop
    that /healthz and every other request need."""
    if getattr(store, "blocking", False):
        from anyio import to_thread

        async def call(fn, *args):
            return await to_thread.run_sync(fn, *args)
    else:
        async def call(fn, *args):
            return fn(*args)
    return call


def lookup_endpoint(store, metrics: Metrics, call, max_items: int, max_body_bytes: int, allow_client_now: bool,
                    consumers: ConsumerCodeSpaces | None):
    """``POST /v1/lookup`` as a bare ASGI handler: Starlette's request and response objects and
    routing cost as much as the lookup itself. Every outcome is counted in ``metrics``."""

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
                await respond(send, 200, json_bytes({"snapshot": run_id, "code_version": served_space,
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

    return lookup


def rest_endpoints(store, metrics: Metrics, call):
    """Health, readiness, metrics and status through Starlette, and 405 for any method but POST on
    /v1/lookup; JSON errors, 404 for an unknown path."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str, **headers) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers or None)

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
    return rest


def build_app(store, metrics: Metrics, max_items: int = 1000, max_body_bytes: int = 1 << 20,
              allow_client_now: bool = False, consumers: ConsumerCodeSpaces | None = None):
    """The ASGI application: ``POST /v1/lookup`` to its bare handler, everything else to Starlette."""
    call = store_caller(store)
    lookup = lookup_endpoint(store, metrics, call, max_items, max_body_bytes, allow_client_now, consumers)
    rest = rest_endpoints(store, metrics, call)

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/lookup":
            await lookup(scope, receive, send)
        else:
            await rest(scope, receive, send)

    return app
