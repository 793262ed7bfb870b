"""The lookup's Prometheus counters, summed over every worker process, and the /metrics text."""

from __future__ import annotations

import os

import numpy as np

from feature_store.resolution import TIERS

LATENCY_BUCKETS_MS = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)


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
