"""What a lookup request may be: its JSON body parsed and checked, the headers that say who sent it
and in what form, and which answer format it asks for. Every refusal is a ``BadRequest`` with the
status and the reason the caller gets."""

from __future__ import annotations

import json
from datetime import datetime

from feature_store.ids import id_problem
from lookup.wire import BINARY_TYPE


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
