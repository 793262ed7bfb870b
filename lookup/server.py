"""One lookup server: the app and its protocol under uvicorn on a listening socket."""

from __future__ import annotations

import threading

from lookup.app import ConsumerCodeSpaces, build_app
from lookup.metrics import Metrics
from lookup.protocol import deadline_protocol


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
