"""Turn a click-only log into ranking requests with candidate lists.

A click log says what a user clicked, not what they were shown. SOLARIS needs requests with
candidates and labels, so each click becomes one request whose candidates are:

- the clicked item (label 1), and
- K distinct items (label 0) drawn the way clicks are drawn: in proportion to their clicks in the
  W whole hours before the click's hour (successive seeded draws from a sample of ``pool_size``
  click events of that window, skipping repeats), never the clicked item itself.

Only clicks before the request's hour decide its candidates (point-in-time correct), so the
first W hours of a log have shorter candidate lists. The draws are seeded hashes of
(seed, request_id, slot), and the clicked item's position a seeded hash of (seed, request_id):
the same input and seed always give the same requests, and neither position nor popularity
gives the label away (``leak_statistics`` measures both on every ingest).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from include.config import ClickLogConfig


def click_pools(clicks: DataFrame, params: ClickLogConfig) -> DataFrame:
    """(hour, pool): a seeded uniform sample of ``pool_size`` click *events* of the W whole hours before
    ``hour``, so an item is in the pool as often as its share of those clicks; the whole stream when
    it has fewer events. ``clicks`` needs ``user_id``, ``item_id`` and ``ts``.

    Drawing negatives from the most clicked items instead (as this generator once did) gives the
    label away: the clicked item is then, far more often than a negative, not among them, and item
    popularity alone separates clicks from negatives.
    """
    events = clicks.select("user_id", "item_id", "ts", (F.unix_seconds("ts") / 3600).cast("long").alias("click_hour"))
    # Each hour's clicks feed the W hours after it.
    offsets = F.sequence(F.lit(1), F.lit(params.window_hours))
    windowed = (events.withColumn("offset", F.explode(offsets))
                .withColumn("hour", F.col("click_hour") + F.col("offset"))
                # an independent, seeded draw per target hour; the event's own fields make it repeatable
                .withColumn("h", F.xxhash64(F.lit(params.seed), "user_id", "item_id", F.unix_micros("ts"), "hour")))
    return (windowed.groupBy("hour")
            .agg(F.slice(F.array_sort(F.collect_list(F.struct("h", "item_id"))), 1, params.pool_size).alias("sample"))
            .select("hour", F.expr("transform(sample, s -> s.item_id)").alias("pool")))


def leak_statistics(requests: DataFrame, clicks: DataFrame) -> dict[str, float]:
    """Single-feature AUCs on generated requests, a check that no one feature gives the label away:
    the item's clicks in the whole hour before the request (prior popularity) and the position.
    Near 0.5 is what unbiased candidates give; far from it means the data, not a model, separates
    the labels. ``clicks``: (item_id, ts) of every click the pools were drawn from."""
    from model.metrics import auc_from_histogram

    hourly = (clicks.select("item_id", ((F.unix_seconds("ts") / 3600).cast("long") + 1).alias("req_hour"))
              .groupBy("req_hour", "item_id").agg(F.count(F.lit(1)).alias("prior_clicks")))
    scored = (requests.select("item_id", "label", "position", (F.unix_seconds("ts") / 3600).cast("long").alias("req_hour"))
              .join(hourly, ["req_hour", "item_id"], "left").fillna(0, ["prior_clicks"]))
    out = {}
    for name, column in (("popularity_auc", "prior_clicks"), ("position_auc", "position")):
        hist = scored.groupBy(column).agg(F.sum("label").alias("pos"), F.sum(1 - F.col("label")).alias("neg")).collect()
        out[name] = auc_from_histogram([r[column] for r in hist], [r.pos for r in hist], [r.neg for r in hist])
    return out


def clicks_to_requests(clicks: DataFrame, params: ClickLogConfig, source: str,
                       prior_clicks: DataFrame | None = None) -> DataFrame:
    """One request per click, exploded to one row per candidate.

    ``clicks`` has user_id, item_id, ts and the context columns (surface, device, region,
    referrer); ``prior_clicks`` (item_id, ts) are clicks of the same log ingested earlier, so
    that ingesting a log hour by hour draws the same candidates as ingesting it whole.
    """
    recent = clicks.select("user_id", "item_id", "ts")
    if prior_clicks is not None:
        recent = recent.unionByName(prior_clicks.select("user_id", "item_id", "ts"))
    pools = click_pools(recent, params)

    k, seed = params.negatives_per_click, params.seed
    requests = (clicks
                .withColumn("request_id", F.concat_ws(":", F.lit(source), "user_id",
                                                      F.unix_millis("ts").cast("string"), "item_id"))
                .withColumn("hour", (F.unix_seconds("ts") / 3600).cast("long"))
                .join(F.broadcast(pools), "hour", "left")
                .withColumn("pool", F.coalesce("pool", F.array().cast("array<string>"))))
    # Successive draws from the pool's events (each an index by a seeded hash of the request and the
    # draw), skipping the clicked item and items drawn already, until K distinct: K draws without
    # replacement, each in proportion to the item's recent clicks. 4K draws leave fewer than K only
    # when a handful of items hold nearly all of the window's clicks. Constant work per request,
    # whatever the pool size (sorting the whole pool per request made a large log's ingest hours long).
    draws = 4 * k
    negatives = F.expr(
        f"CASE WHEN size(pool) = 0 THEN array() ELSE slice(array_distinct(filter(transform(sequence(0, {draws - 1}), "
        f"j -> element_at(pool, cast(pmod(xxhash64({seed}, request_id, j), size(pool)) AS INT) + 1)), "
        f"x -> x != item_id)), 1, {k}) END")
    requests = requests.withColumn("negatives", negatives)
    slot = F.pmod(F.xxhash64(F.lit(seed), "request_id", F.lit("slot")), F.size("negatives") + 1).cast("int")
    candidates = F.concat(F.slice("negatives", 1, slot), F.array("item_id"),
                          F.slice("negatives", slot + 1, F.greatest(F.size("negatives") - slot, F.lit(0))))
    requests = requests.withColumn("clicked", F.col("item_id")).withColumn("candidates", candidates)
    rows = requests.select("request_id", "user_id", "clicked", "ts", "surface", "device", "region", "referrer",
                           F.posexplode("candidates").alias("position", "item_id"))
    return rows.select(
        "request_id", "user_id", "item_id", "ts", "position",
        F.when(F.col("item_id") == F.col("clicked"), 1).otherwise(0).alias("label"),
        "surface", "device", "region", "referrer",
        F.lit(source).alias("source"),
        F.to_date("ts").alias("date"),
        F.hour("ts").alias("hour"),
    )
