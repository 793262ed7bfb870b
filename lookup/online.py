"""The embedded online store: the newest published snapshot in memory, reloaded in the background.

``OnlineStore.lookup(user_id, item_ids, now)`` answers with the shared rule
(feature_store/resolution.py) on the snapshot current when the call began. A poller thread
watches ``feature_versions`` (delta-rs, no JVM); when a new run is published it loads the new
snapshot beside the old one and swaps one reference, so a request sees the old snapshot or the
new one, never half of each. A version that fails to load leaves the old one serving and is
reported in ``status()``; at start-up (or whenever the newest fails) the newest publication that
does load is served, and ``status()`` says which newer ones were skipped and why. Tables missing at
start-up give an empty snapshot (tier ``none``, of the configured dimension) and ``ready = False``
until a publication loads.

Misses (candidates served without their exact embedding) go to a bounded buffer that a second
thread appends to ``miss_queue``; a full buffer drops and counts, the request never waits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
from deltalake import write_deltalake

from feature_store.ids import id_problem
from feature_store.lake import arrow_schema, as_utc, read_arrow, table_path, utc_now
from feature_store.resolution import EXACT, NONE, Snapshot
from lookup.store import LookupStore
from feature_store.tables import FEATURE_VERSIONS, MISS_QUEUE

log = logging.getLogger("solaris.online")


@dataclass(frozen=True)
class Published:
    run_id: str
    interval_end: datetime
    # the serving tables' Delta versions, the code space served (code_version) and, in a rollout, the
    # new one resolved in shadow (shadow_code_version)
    versions: dict[str, int | str]


def publications(tables_root: str | Path) -> list[Published]:
    """Every row of feature_versions, newest first; empty when nothing was published yet."""
    try:
        rows = read_arrow(tables_root, FEATURE_VERSIONS).to_pylist()
    except FileNotFoundError:
        return []
    rows.sort(key=lambda r: (r["interval_end"], r["published_at"]), reverse=True)
    return [Published(r["run_id"], r["interval_end"],
                      {k: int(v) for k, v in r.items() if k.endswith("_version") and not k.endswith("code_version")
                       and v is not None}
                      | {k: r[k] for k in ("code_version", "shadow_code_version") if r.get(k)})
            for r in rows]


def latest_publication(tables_root: str | Path) -> Published | None:
    """The newest row of feature_versions, or None when nothing was published yet."""
    found = publications(tables_root)
    return found[0] if found else None


class MissRecorder:
    """Bounded buffer of (user_id, item_id, requested_at) flushed to miss_queue by a background thread.

    The flusher never creates ``miss_queue``: until a Spark job has created it from its declaration,
    flushes fail and keep their rows. Nothing stops the flusher: a failed write keeps its rows for the next try (as many as the buffer
    holds; the rest are counted as dropped) and is counted in ``flush_errors`` with ``last_error``;
    a row whose id cannot be stored (the lookup refuses those, so only a direct caller can bring
    one) is counted in ``rejected`` and logged, and the rest of its batch is written.
    Within one flush interval a pair is queued once (``repeated`` counts the rest) and a user at
    most ``per_user`` pairs (``capped`` counts the rest). ``stop()`` flushes what is left.
    """

    def __init__(self, tables_root: str | Path, capacity: int = 100_000, flush_seconds: float = 2.0,
                 per_user: int = 200):
        self.path = str(table_path(tables_root, MISS_QUEUE))
        self.capacity, self.flush_seconds, self.per_user = capacity, flush_seconds, per_user
        self._buf: list[tuple[str, str, datetime]] = []
        # What this flush interval holds already, per user: a pair missed again is not queued twice,
        # and one user (one client replaying requests) queues at most ``per_user`` pairs an
        # interval, so a single source cannot flood the queue or crowd out everyone else's misses.
        self._pending: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self.recorded = self.dropped = self.flushed = self.flush_errors = self.rejected = 0
        self.repeated = self.capped = 0
        self._writing = 0  # rows taken out of the buffer by a flush under way: still held, not written
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="miss-flusher", daemon=True)

    def start(self) -> "MissRecorder":
        self._thread.start()
        return self

    def add(self, user_id: str, item_ids, now: datetime) -> None:
        with self._lock:
            pending = self._pending.setdefault(user_id, set())
            new = [i for i in dict.fromkeys(item_ids) if i not in pending]
            self.repeated += len(item_ids) - len(new)
            fits = new[: max(self.per_user - len(pending), 0)]
            self.capped += len(new) - len(fits)
            take = fits[: max(self.capacity - len(self._buf), 0)]
            self.dropped += len(fits) - len(take)
            pending.update(take)
            self._buf.extend((user_id, i, now) for i in take)
            self.recorded += len(take)

    def flush(self) -> int:
        """Append the buffered misses to miss_queue; returns how many were written."""
        with self._lock:
            rows, self._buf, self._pending = self._buf, [], {}
            good, bad = [], []
            for r in rows:
                (good if id_problem(r[0]) is None and id_problem(r[1]) is None else bad).append(r)
            self.rejected += len(bad)
            self._writing = len(good)
        if bad:
            log.error("%d misses with ids that cannot be stored were not queued, e.g. user %r item %r",
                      len(bad), bad[0][0], bad[0][1])
        if not good:
            return 0
        try:
            if not (Path(self.path) / "_delta_log").is_dir():
                # Created by the Spark jobs from its declaration (with its comments), never here: a table
                # that delta-rs created first would not match the declaration, and every job would fail
                raise FileNotFoundError(f"{self.path} does not exist yet: the first Spark job creates miss_queue")
            self._append(good)
        except Exception as e:  # the table is missing or busy: keep what fits, try again next time
            with self._lock:  # the rows and the counters change together: status() sees both or neither
                keep = good[: max(self.capacity - len(self._buf), 0)]
                self.dropped += len(good) - len(keep)
                self._buf = keep + self._buf
                for user, item, _ in keep:
                    self._pending.setdefault(user, set()).add(item)
                self._writing = 0
                self.flush_errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
            log.warning("miss_queue flush failed (%s); %d misses kept for the next try", self.last_error, len(good))
            return 0
        with self._lock:
            self._writing = 0
            self.flushed += len(good)
            self.last_error = None
        return len(good)

    def _append(self, rows) -> None:
        """One append; tried once more at once when it lost a race with precompute's pruning of
        old rows (an hourly delete that touches none of the files this append adds)."""
        from deltalake.exceptions import CommitFailedError

        try:
            write_deltalake(self.path, self._arrow(rows), mode="append")
        except CommitFailedError:
            write_deltalake(self.path, self._arrow(rows), mode="append")

    @staticmethod
    def _arrow(rows):
        import pyarrow as pa

        return pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows],
                         "requested_at": [r[2] for r in rows], "origin": ["lookup"] * len(rows),
                         "consumed_by_run": [None] * len(rows)}, schema=arrow_schema(MISS_QUEUE))

    def _run(self) -> None:
        while not self._stop.wait(self.flush_seconds):
            try:
                self.flush()
            except Exception as e:  # the thread outlives any one bad batch
                with self._lock:
                    self._writing = 0
                    self.flush_errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"
                log.exception("miss_queue flusher error")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.flush()

    def status(self) -> dict:
        """The counters at one instant; ``buffered`` counts every miss held and not yet written,
        those of a flush under way included."""
        with self._lock:
            return {"recorded": self.recorded, "repeated": self.repeated, "capped": self.capped,
                    "dropped": self.dropped, "flushed": self.flushed,
                    "flush_errors": self.flush_errors, "rejected": self.rejected,
                    "buffered": len(self._buf) + self._writing, "last_error": self.last_error}


@dataclass
class _State:
    snapshot: Snapshot
    published: Published | None
    loaded_at: float = field(default_factory=time.time)
    shadow: Snapshot | None = None  # in a rollout: the new code space, for consumers already trained on it


class OnlineStore(LookupStore):
    """Lookups on the newest published snapshot, with background reload and miss recording."""

    def __init__(self, tables_root: str | Path, dim: int | None = None, poll_seconds: float = 5.0,
                 record_misses: bool = True, miss_capacity: int = 100_000, miss_flush_seconds: float = 2.0,
                 miss_per_user: int = 200):
        self.tables_root, self.dim, self.poll_seconds = str(tables_root), dim, poll_seconds
        self._state = _State(Snapshot.empty(dim or 32), None)  # dim None: the size the tables hold
        self.misses = MissRecorder(tables_root, miss_capacity, miss_flush_seconds, miss_per_user) \
            if record_misses else None
        self.reloads = self.reload_failures = 0
        self.code_version_mismatches = 0  # lookups that named another code space than the one served
        self._spaces: dict[str, tuple[str | None, ...]] = {}  # run id -> the code spaces it answers in
        self._count_lock = threading.Lock()
        self.last_error: str | None = None
        self.newest_run_id: str | None = None  # the newest publication, served or not
        self.skipped: dict[str, str] = {}  # newer publications that failed to load -> why
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="snapshot-poller", daemon=True)

    @property
    def ready(self) -> bool:
        return self._state.published is not None

    @property
    def snapshot(self) -> Snapshot:
        return self._state.snapshot

    def start(self) -> "OnlineStore":
        self.poll_once()
        if self.misses:
            self.misses.start()
        self._poller.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._poller.is_alive():
            self._poller.join(timeout=10)
        if self.misses:
            self.misses.stop()

    def poll_once(self) -> bool:
        """Load and swap in the newest loadable publication if it is newer than the one served;
        True when a new snapshot went live. A publication that fails to load is skipped for the
        next older one (a restarted replica serves the newest good snapshot, not nothing), and the
        skip is reported in ``status()``."""
        try:
            pubs = publications(self.tables_root)
        except Exception as e:  # feature_versions itself unreadable: keep serving what we have
            self._failed(None, e)
            return False
        current = self._state.published
        if not pubs or (current is not None and pubs[0].run_id == current.run_id
                        and pubs[0].versions == current.versions):
            return False
        self.newest_run_id = pubs[0].run_id
        for pub in pubs:
            if current is not None and (pub.interval_end, pub.run_id) <= (current.interval_end, current.run_id):
                break  # what is served already is as new as anything left to try
            if pub.run_id in self.skipped:
                continue  # failed before; a publication's versions never change
            try:
                snap = Snapshot.load(self.tables_root, pub.versions, self.dim, pub.run_id)
            except Exception as e:  # a corrupt or unreadable version: try the next older one
                self._failed(pub.run_id, e)
                continue
            shadow = self._load_shadow(pub)
            # before the swap: an answer can always say its code space
            self._spaces[pub.run_id] = (snap.code_version, *([shadow.code_version] if shadow else []))
            self._state = _State(snap, pub, shadow=shadow)  # one reference swap: requests see old or new, never a mix
            self.reloads += 1
            self.last_error = None if pub.run_id == self.newest_run_id else self.last_error
            log.info("serving snapshot %s (%s)%s", pub.run_id, snap.stats,
                     "" if pub.run_id == self.newest_run_id else f"; newer ones failed to load: {sorted(self.skipped)}")
            return True
        return False

    def _load_shadow(self, pub: Published) -> Snapshot | None:
        """In a rollout, the publication's rows of the new code space: the consumers promoted on it
        are answered in it while the others are still answered in the served one. A shadow that
        fails to load is reported, and those consumers are answered ``none`` (counted)."""
        space = pub.versions.get("shadow_code_version")
        if not space:
            return None
        try:
            return Snapshot.load(self.tables_root, {**pub.versions, "code_version": space}, self.dim, pub.run_id)
        except Exception as e:
            self.reload_failures += 1
            self.last_error = f"shadow code space {space} of {pub.run_id} failed to load: {type(e).__name__}: {e}"
            log.error("%s", self.last_error)
            return None

    def _failed(self, run_id: str | None, e: Exception) -> None:
        self.reload_failures += 1
        self.last_error = f"{type(e).__name__}: {e}"
        if run_id is not None:
            self.skipped[run_id] = self.last_error
        log.error("snapshot %s failed to load, still serving %s: %s", run_id or "listing",
                  self._state.published.run_id if self._state.published else "nothing", self.last_error)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.poll_once()

    def lookup(self, user_id: str, item_ids, now: datetime | None = None, code_version: str | None = None
               ) -> tuple[np.ndarray, np.ndarray, str | None]:
        """(embeddings (n, dim) float32, tier codes (n,), snapshot run id). ``now`` defaults to the clock.
        ``code_version``: the code space the caller reads (its consumer VM's); the snapshot of another
        answers tier ``none`` with zeros for every item, and is counted, never a code the caller
        would misread."""
        state = self._state  # the snapshot for the whole request, whatever a reload does meanwhile
        run_id = state.published.run_id if state.published else None
        snapshot = state.snapshot
        if code_version is not None and code_version != snapshot.code_version:
            if state.shadow is not None and code_version == state.shadow.code_version:
                snapshot = state.shadow  # a consumer already trained on the rollout's new code space
            else:
                with self._count_lock:
                    self.code_version_mismatches += 1
                return np.zeros((len(item_ids), snapshot.dim), np.float32), np.full(len(item_ids), NONE, np.int8), run_id
        now = now or utc_now()
        emb, tiers = snapshot.lookup(user_id, item_ids, now)
        if self.misses is not None and len(tiers):
            missed = tiers != EXACT
            if missed.any():
                self.misses.add(user_id, np.asarray(item_ids, dtype=object)[missed].tolist(), now)
        return emb, tiers, run_id

    def answer_space(self, run_id: str | None, code_version: str | None = None) -> str | None:
        """The code space of an answer of the publication ``run_id`` to a lookup that named
        ``code_version``: that one where the publication holds it, else the one it serves."""
        spaces = self._spaces.get(run_id, (None,)) if run_id else (None,)
        return code_version if code_version is not None and code_version in spaces else spaces[0]

    def status(self) -> dict:
        state = self._state
        pub = state.published
        return {"ready": pub is not None, "snapshot_run_id": pub.run_id if pub else None,
                "newest_publication": self.newest_run_id,
                "serving_older_publication": pub is not None and self.newest_run_id not in (None, pub.run_id),
                "skipped_publications": dict(self.skipped),
                "snapshot_versions": pub.versions if pub else None,
                # the code space every code served belongs to: a consumer VM reads only its own
                "code_version": state.snapshot.code_version, "code_version_mismatches": self.code_version_mismatches,
                # in a rollout: the new code space, answered to the consumers already trained on it
                "shadow_code_version": state.shadow.code_version if state.shadow else None,
                "snapshot_loaded_seconds_ago": round(time.time() - state.loaded_at, 3),
                # how old the data is: the publication's interval end (its run's t), not the load
                "snapshot_data_age_seconds": round(time.time() - as_utc(pub.interval_end).timestamp(), 3) if pub else None,
                "snapshot_stats": state.snapshot.stats, "dim": state.snapshot.dim,
                "reloads": self.reloads, "reload_failures": self.reload_failures, "last_error": self.last_error,
                "misses": None if self.misses is None else self.misses.status()}
