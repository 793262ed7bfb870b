"""What a user or item id may be, wherever one enters SOLARIS (a lookup request, an ingested log).

Ids are keys in Delta tables, Redis and Arrow buffers, all of which store UTF-8. A string Python
holds but UTF-8 cannot (a lone surrogate such as ``"u\\ud800"``, which JSON's ``\\ud800`` escape
produces) fails the first write that meets it, far from the request that brought it; control
characters and unbounded lengths break logs, CSV exports and key sizes. Each is refused at the
door with the reason instead.
"""

from __future__ import annotations

import re

MAX_ID_LENGTH = 256
# C0 controls, DEL, and the surrogate block (never valid alone in UTF-8).
_UNSTORABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an id, or None when it can."""
    if not value:
        return "is empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long, over the {MAX_ID_LENGTH}-character limit"
    bad = _UNSTORABLE.search(value)
    if bad:
        code = ord(bad.group())
        kind = "a lone surrogate, not storable as UTF-8" if 0xD800 <= code <= 0xDFFF else "a control character"
        return f"holds U+{code:04X} at offset {bad.start()} ({kind})"
    return None
