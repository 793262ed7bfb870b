"""One hourly cycle at t, the stages in the order the hourly DAG runs them:

1. resolve: the requests of [t - step, t) get the features served at their timestamps
   (``request_features``; snapshots published before t), misses optionally queued;
2. precompute: speculate, verify, embed, MERGE (``pair_embeddings``), expire;
3. user_means: partial sums of this run, means over the window (``user_mean_embeddings``);
4. user_neighbors: FAISS KNN over FM user vectors (``user_neighbors``);
5. publish: the tables' Delta versions (``feature_versions``), which the lookup serves from t on.

Resolving the past hour before this hour's writes is what makes it as-of correct without relying
on the order: it reads only snapshots published before each request.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

STAGES = ("resolve", "precompute", "user_means", "user_neighbors", "publish")


def run(spark, cfg, t: datetime, step_hours: float = 1.0, stages: tuple[str, ...] = STAGES,
        record_misses: bool = False, log=print) -> dict[str, dict]:
    """Run ``stages`` for the interval ending at t. Returns each stage's counters by stage name,
    and under ``"seconds"`` each stage's wall time (what a backfill and the hourly benchmark report)."""
    from spark_jobs import precompute, publish, resolve_features, user_means, user_neighbors

    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
    jobs = {
        "resolve": lambda: resolve_features.run(spark, cfg, t - timedelta(hours=step_hours), t, record_misses),
        "precompute": lambda: precompute.run(spark, cfg, t),
        "user_means": lambda: user_means.run(spark, cfg, t),
        "user_neighbors": lambda: user_neighbors.run(spark, cfg, t),
        "publish": lambda: publish.run(spark, cfg, t),
    }
    out: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for stage in STAGES:  # the DAG's order, whatever order ``stages`` names them in
        if stage not in stages:
            continue
        t0 = time.perf_counter()
        result = jobs[stage]()
        seconds[stage] = round(time.perf_counter() - t0, 2)
        if stage == "precompute":
            log("\n".join(result.lines()))
            result = result.row()
        out[stage] = result
    for stage in ("resolve", "user_means", "user_neighbors", "publish"):
        if stage in out:
            log(f"{stage}: " + ", ".join(f"{k}={v}" for k, v in out[stage].items()))
    log("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()) + f", cycle {sum(seconds.values()):.1f}")
    out["seconds"] = seconds
    return out
