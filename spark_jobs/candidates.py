"""Turn a click-only log into ranking requests with candidate lists.

A click log says what a user clicked, not what they were shown. SOLARIS needs requests with
candidates and labels, so each click becomes one request whose candidates are:

- the clicked item (label 1), and
- K items (label 0) drawn from the ``pool_size`` items most clicked in the W whole hours before
  the click's hour, excluding the clicked item.

Only clicks before the request's hour decide its candidates (point-in-time correct), so the
first W hours of a log have shorter candidate lists. The draw is a seeded hash of
(seed, request_id, item), and the clicked item's position a seeded hash of (seed, request_id):
the same input and seed always give the same requests, and position does not leak the label.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from include.config import ClickLogConfig


def popularity_pools(clicks: DataFrame, params: ClickLogConfig) -> DataFrame:
    """(hour, pool) where pool holds the ``pool_size`` most clicked items of the W hours before ``hour``.

    ``clicks`` needs ``item_id`` and ``ts``. Ties break on item_id so the pool is deterministic.
    """
    hourly = (clicks.select("item_id", (F.unix_seconds("ts") / 3600).cast("long").alias("click_hour"))
              .groupBy("click_hour", "item_id").count())
    # Each hour's counts feed the W hours after it.
    offsets = F.sequence(F.lit(1), F.lit(params.window_hours))
    windowed = (hourly.withColumn("offset", F.explode(offsets))
                .select((F.col("click_hour") + F.col("offset")).alias("hour"), "item_id", "count")
                .groupBy("hour", "item_id").agg(F.sum("count").alias("clicks")))
    return (windowed.groupBy("hour")
            .agg(F.sort_array(F.collect_list(F.struct((-F.col("clicks")).alias("neg"), "item_id"))).alias("ranked"))
            .select("hour", F.expr(f"transform(slice(ranked, 1, {params.pool_size}), r -> r.item_id)").alias("pool")))


def clicks_to_requests(clicks: DataFrame, params: ClickLogConfig, source: str,
                       prior_clicks: DataFrame | None = None) -> DataFrame:
    """One request per click, exploded to one row per candidate.

    ``clicks`` has user_id, item_id, ts and the context columns (surface, device, region,
    referrer); ``prior_clicks`` (item_id, ts) are clicks of the same log ingested earlier, so
    that ingesting a log hour by hour draws the same candidates as ingesting it whole.
    """
    popular_from = clicks.select("item_id", "ts")
    if prior_clicks is not None:
        popular_from = popular_from.unionByName(prior_clicks.select("item_id", "ts"))
    pools = popularity_pools(popular_from, params)

    k, seed = params.negatives_per_click, params.seed
    requests = (clicks
                .withColumn("request_id", F.concat_ws(":", F.lit(source), "user_id",
                                                      F.unix_millis("ts").cast("string"), "item_id"))
                .withColumn("hour", (F.unix_seconds("ts") / 3600).cast("long"))
                .join(F.broadcast(pools), "hour", "left")
                .withColumn("pool", F.coalesce("pool", F.array().cast("array<string>"))))
    # Order the pool by a seeded hash per request, drop the clicked item, keep K.
    negatives = F.expr(
        f"slice(filter(transform(array_sort(transform(pool, x -> named_struct('h', xxhash64({seed}, request_id, x), 'i', x))),"
        f" s -> s.i), x -> x != item_id), 1, {k})")
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
