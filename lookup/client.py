"""A small client for the lookup service: one kept-alive connection, binary responses by default.

    from lookup.client import LookupClient
    with LookupClient("http://127.0.0.1:8765") as c:
        embeddings, tiers, snapshot = c.lookup("u1", ["i1", "i2"])
"""

from __future__ import annotations

import http.client
import json
from datetime import datetime
from urllib.parse import urlsplit

import numpy as np

from feature_store.resolution import TIERS
from lookup.wire import BINARY_TYPE, decode_binary


class LookupFailed(RuntimeError):
    """The service answered with an error status; ``status`` and the server's message are kept."""

    def __init__(self, status: int, message: str):
        super().__init__(f"lookup failed ({status}): {message}")
        self.status = status


class LookupClient:
    def __init__(self, url: str = "http://127.0.0.1:8765", timeout: float = 5.0, binary: bool = True):
        u = urlsplit(url)
        self.host, self.port, self.timeout, self.binary = u.hostname, u.port or 80, timeout, binary
        self._conn: http.client.HTTPConnection | None = None
        self.last_code_version: str | None = None  # the code space of the last answer (None: none recorded)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers with lower-case names, body); reconnects once if the kept-alive
        connection was closed."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def lookup(self, user_id: str, item_ids: list[str], now: datetime | None = None, code_version: str | None = None,
               consumer: str | None = None) -> tuple[np.ndarray, list[str], str | None]:
        """(embeddings (n, dim) float32, tier names, snapshot run id). ``code_version``: the code space
        the caller's VM reads, or ``consumer``: the consumer whose promoted SOLARIS VM names it; a
        snapshot of another answers ``none`` for every item. The answer's code space is left in
        ``last_code_version``."""
        req = {"user_id": user_id, "item_ids": list(item_ids)}
        if now is not None:
            req["now"] = now.isoformat()
        if code_version is not None:
            req["code_version"] = code_version
        if consumer is not None:
            req["consumer"] = consumer
        headers = {"Content-Type": "application/json", "Accept": BINARY_TYPE if self.binary else "application/json"}
        status, resp_headers, data = self.request("POST", "/v1/lookup", json.dumps(req).encode(), headers)
        if status != 200:
            raise LookupFailed(status, json.loads(data).get("error", data.decode(errors="replace")))
        snapshot = resp_headers.get("x-solaris-snapshot") or None
        self.last_code_version = resp_headers.get("x-solaris-code-version") or None
        if resp_headers.get("content-type", "").split(";")[0].strip() == BINARY_TYPE:
            emb, codes = decode_binary(data)
            return emb, [TIERS[c] for c in codes], snapshot
        body = json.loads(data)
        return np.asarray(body["embeddings"], np.float32).reshape(-1, body["dim"]), body["tiers"], body["snapshot"]

    def get_json(self, path: str) -> tuple[int, dict]:
        status, _, data = self.request("GET", path)
        return status, json.loads(data)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "LookupClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
