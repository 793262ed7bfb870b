"""The HTTP protocol under the app: uvicorn's httptools protocol with bounds on a request's head, a
deadline per request, a cap on connections and a draining shutdown."""

from __future__ import annotations

from lookup.app import json_bytes
from lookup.metrics import Metrics

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
            body = json_bytes({"error": message})
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
