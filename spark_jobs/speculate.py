"""Speculate and verify: which (user, item) pairs are worth an FM embedding for the run ending at t.

Candidates are every user active in the look-back window [t - W, t) crossed with the items
recently shown to them plus the window's trending items, plus the waiting pairs of the miss
queue. The current VM (the verifier) scores them all inside Spark (``mapInPandas``, one model
load per Python worker); the top ``budget`` share is selected (globally or per user), queued
misses are always selected, and pairs whose stored embedding is fresh past t + margin are
skipped. Everything scored is written to ``verifier_scores`` (partition = run) for audit.

    (run inside spark_jobs/precompute.py; there is no separate entry point)
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from model.interface import BUILTIN_VM


def window_start(pc, t: datetime) -> datetime:
    """Start of the look-back window [t - W, t) whose users and items are speculated."""
    return t - timedelta(hours=pc.lookback_hours)


def candidates(window_requests: DataFrame, misses: DataFrame, p) -> DataFrame:
    """(user_id, item_id, origin, device, surface) to score; pure.

    ``window_requests``: request_log rows in [t - W, t); ``misses``: waiting miss-queue pairs
    (user_id, item_id, requested_at); ``p``: the ``[precompute]`` config section.
    """
    latest = Window.partitionBy("user_id").orderBy(F.col("ts").desc(), F.col("request_id").desc())
    users = (window_requests.withColumn("_n", F.row_number().over(latest)).where("_n = 1")
             .select("user_id", "device", "surface"))
    per_user = Window.partitionBy("user_id").orderBy(F.col("last_shown").desc(), "item_id")
    recent = (window_requests.groupBy("user_id", "item_id").agg(F.max("ts").alias("last_shown"))
              .withColumn("_n", F.row_number().over(per_user)).where(F.col("_n") <= p.recent_items_per_user)
              .select("user_id", "item_id"))
    trending = (window_requests.groupBy("item_id")
                .agg(F.sum(F.coalesce("label", F.lit(0))).alias("clicks"), F.count(F.lit(1)).alias("shown"))
                .orderBy(F.col("clicks").desc(), F.col("shown").desc(), "item_id").limit(p.trending_items)
                .select("item_id"))
    speculated = (recent.unionByName(users.select("user_id").crossJoin(F.broadcast(trending))).distinct()
                  .join(users, "user_id").withColumn("origin", F.lit("speculated")))
    # Bounded: at most queue_per_user pairs of a user and queue_max_pairs in all (the rest wait),
    # misses of users with requests in the window first (a lookup client can invent user ids; the
    # request log holds real traffic), then the most recently requested; ties broken by ids, so
    # reruns take the same pairs. The overall cap is a top-k (each partition keeps its own k best,
    # one task merges those), not a row number over one global window, which moves every queued
    # pair into one task.
    newest = (misses.groupBy("user_id", "item_id").agg(F.max("requested_at").alias("_at"))
              .join(users.select("user_id", F.lit(1).alias("_active")), "user_id", "left")
              .fillna(0, ["_active"]))
    per_user = Window.partitionBy("user_id").orderBy(F.col("_at").desc(), "item_id")
    queued = (newest.withColumn("_n", F.row_number().over(per_user)).where(F.col("_n") <= p.queue_per_user)
              .orderBy(F.col("_active").desc(), F.col("_at").desc(), "user_id", "item_id").limit(p.queue_max_pairs)
              .select("user_id", "item_id").join(users, "user_id", "left").withColumn("origin", F.lit("miss_queue")))
    # A queued pair that was also speculated is kept once, as queued (queued pairs are always selected).
    speculated = speculated.join(queued.select("user_id", "item_id"), ["user_id", "item_id"], "left_anti")
    return speculated.unionByName(queued).select("user_id", "item_id", "origin", "device", "surface")


def score(cands: DataFrame, vm_path: str, t: datetime,
          allowed: frozenset[str] = frozenset({BUILTIN_VM})) -> DataFrame:
    """Add ``score``: the verifier VM's click probability, batched per Arrow batch inside Spark."""
    import pandas as pd

    def predict(batches):
        from model.inference import vm_scores

        for pdf in batches:
            pdf = pdf.assign(ts=pd.Timestamp(t))
            s = vm_scores(pdf, vm_path, allowed=allowed)
            yield pdf.drop(columns=["ts"]).assign(score=s.astype("float64"))

    schema = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in cands.schema.fields) + ", score double"
    return cands.mapInPandas(predict, schema)


# Rank accuracy of the global threshold: the selected share is within 1/QUANTILE_ACCURACY of the
# budget. Each partition summarises its scores in a sketch of bounded size and one task merges the
# sketches; an exact quantile holds every score in one place.
QUANTILE_ACCURACY = 10_000


def budget_threshold(speculated: DataFrame, budget: float) -> float | None:
    """The score above which the top ``budget`` share of ``speculated`` lies (None when empty); the
    same scores in the same partitions give the same threshold on every rerun."""
    return speculated.agg(F.percentile_approx("score", 1.0 - budget, QUANTILE_ACCURACY)).first()[0]


def tie_order() -> Column:
    """A pair's place in [0, 1) among pairs of equal score: a hash of the pair, so the same pairs
    win a tie on every rerun and in any partitioning."""
    return F.pmod(F.xxhash64("user_id", "item_id"), F.lit(1 << 53)).cast("double") / float(1 << 53)


def within_budget(speculated: DataFrame, budget: float) -> Column:
    """Whether a speculated pair is in the top ``budget`` share by score. Pairs tied at the
    threshold share what room the budget leaves above it, by ``tie_order``: a verifier that gives
    many pairs one score (every pair of unknown ids, on a sparse log: 45% of the Globo pairs of one
    run) must not pull all of them in, which would select half the pairs at a 20% budget."""
    threshold = budget_threshold(speculated, budget)
    if threshold is None:
        return F.lit(False)
    n = speculated.agg(F.count(F.lit(1)).alias("all"), F.sum((F.col("score") > threshold).cast("long")).alias("above"),
                       F.sum((F.col("score") == threshold).cast("long")).alias("tied")).first()
    room = budget * n["all"] - (n["above"] or 0)
    share = min(max(room / n["tied"], 0.0), 1.0) if n["tied"] else 0.0
    return (F.col("score") > F.lit(threshold)) | ((F.col("score") == F.lit(threshold)) & (tie_order() < F.lit(share)))


def select(scored: DataFrame, fresh: DataFrame, p, t: datetime) -> DataFrame:
    """Mark the precompute set of the run at ``t``; pure given the scores. ``fresh``: (user_id, item_id,
    expires_at) stored now; ``p``: the ``[precompute]`` config section (budget, selection, margin)."""
    bad = scored.where(F.isnan("score") | F.col("score").isNull()).limit(1).count()
    if bad:
        raise ValueError("the verifier produced NaN scores; refusing to select from them (check the VM checkpoint)")
    by_user = Window.partitionBy("user_id").orderBy(F.col("score").desc(), "item_id")
    users_n = Window.partitionBy("user_id")
    ranked = (scored.withColumn("score_rank", F.row_number().over(by_user))
              .withColumn("_n_user", F.count(F.lit(1)).over(users_n)))
    if p.selection == "per_user":
        top = F.col("score_rank") <= F.ceil(F.col("_n_user") * F.lit(p.budget))
    else:
        top = within_budget(scored.where(F.col("origin") == "speculated"), p.budget)
    fresh_until = fresh.select("user_id", "item_id", F.col("expires_at").alias("fresh_until"))
    margin = F.lit(t + timedelta(minutes=p.fresh_margin_minutes))
    return (ranked.join(fresh_until, ["user_id", "item_id"], "left")
            .withColumn("selected", ((F.col("origin") == "miss_queue") | top)
                        & (F.col("fresh_until").isNull() | (F.col("fresh_until") <= margin)))
            .drop("_n_user"))
