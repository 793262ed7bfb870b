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

from datetime import datetime, timedelta

STAGES = ("resolve", "precompute", "user_means", "user_neighbors", "publish")


def run(spark, cfg, t: datetime, step_hours: float = 1.0, stages: tuple[str, ...] = STAGES,
        record_misses: bool = False, log=print) -> dict[str, dict]:
    from spark_jobs import precompute, publish, resolve_features, user_means, user_neighbors

    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
    out: dict[str, dict] = {}
    if "resolve" in stages:
        out["resolve"] = resolve_features.run(spark, cfg, t - timedelta(hours=step_hours), t, record_misses)
    if "precompute" in stages:
        c = precompute.run(spark, cfg, t)
        log("\n".join(c.lines()))
        out["precompute"] = c.row()
    if "user_means" in stages:
        out["user_means"] = user_means.run(spark, cfg, t)
    if "user_neighbors" in stages:
        out["user_neighbors"] = user_neighbors.run(spark, cfg, t)
    if "publish" in stages:
        out["publish"] = publish.run(spark, cfg, t)
    for stage in ("resolve", "user_means", "user_neighbors", "publish"):
        if stage in out:
            log(f"{stage}: " + ", ".join(f"{k}={v}" for k, v in out[stage].items()))
    return out
