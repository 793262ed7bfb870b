"""The interface every online store implements: the embedded snapshot store (lookup/online.py)
and Redis (lookup/redis_store.py). The HTTP service (lookup/serve.py) and the replay
talk to a store only through it, so one can stand in for the other."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

import numpy as np


class StoreUnavailable(RuntimeError):
    """The store's backing service cannot be reached (Redis down): the lookup answers 503 with the
    reason, and /readyz says not ready, until it is back."""


@runtime_checkable
class LookupStore(Protocol):
    def lookup(self, user_id: str, item_ids, now: datetime | None = None, code_version: str | None = None
               ) -> tuple[np.ndarray, np.ndarray, str | None]:
        """(embeddings (n, dim) float32, tier codes (n,) into TIERS, the serving snapshot's run id or None).
        A pair with nothing to serve is tier ``none`` with zeros: a normal answer, never an exception;
        ``StoreUnavailable`` when the backing service cannot be reached at all. With ``code_version``
        (the caller's code space), a snapshot of another code space answers ``none`` for every item."""

    def answer_space(self, run_id: str | None, code_version: str | None = None) -> str | None:
        """The code space of an answer of the snapshot ``run_id`` to a lookup that named
        ``code_version`` (None: none recorded)."""

    def status(self) -> dict:
        """What /v1/status and /readyz report: at least ``ready``, ``snapshot_run_id`` and ``dim``."""

    def stop(self) -> None:
        """Release threads and connections; a stopped store is not used again."""
