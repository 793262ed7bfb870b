"""Turn a click-only log into ranking requests with candidate lists.

A click log says what a user clicked, not what they were shown. SOLARIS needs requests with
candidates and labels, so each click becomes one request whose candidates are:

- the clicked item (label 1), and
- K distinct items (label 0) drawn the way clicks are drawn: in proportion to their clicks among
  the clicks that *follow* the request, in its hour and the next one (widened to later hours until
  the pool holds ``min_pool_clicks`` events, at most ``max_window_hours`` after the click's hour);
  successive seeded draws from a sample of ``pool_size`` of those events, skipping repeats, never
  the clicked item, never a click of the requesting user and never an item they clicked in the
  hour or the next; new items (no click before the request) take as many of the K slots as first
  clicks take of the hour's clicks (``match_new_items``).

Why the clicks that follow: the clicked item is an item whose click is at the request's time, so
every model feature, read as of that time, leaves that click out. A negative drawn from a click
*before* the request has that click in its counters; on a log with few clicks per item the clicked
item almost never does, and "clicked lately" gives the label away (this generator's first form,
a pool of the hour before the click: AUC of the item's clicks in the hour before 0.259 on a sparse
synthetic log, of "any click in the last day" 0.063). A negative drawn from a click after the
request is, like the clicked item, an item about to be clicked.

Single-feature AUCs as of the request (prior popularity: the item's clicks in the hour before /
recent click: any click in the 24 hours before / known item: any click before / position; 0.5 is
no signal; band [0.40, 0.65]; the first form's known-item AUC was not measured):

| log | clicks per active hour | first form (the hour before) | this form |
|---|---:|---|---|
| Globo, whole log (2,988,181 clicks) | 7,761 | - | 0.610 / 0.498 / 0.497 / 0.500 |
| Globo, 5% of users | 365 | 0.542 / 0.459 / - / 0.498 | 0.596 / 0.500 / 0.498 / 0.499 |
| Globo, 0.5% of users | 39 | 0.461 / 0.384 / - / 0.489 | 0.565 / 0.517 / 0.514 / 0.503 |
| Globo, 0.2% of users | 16 | 0.393 / 0.331 / - / 0.464 | 0.554 / 0.535 / 0.534 / 0.503 |
| synthetic, 20,000 items (include/synthetic.py) | 16 | 0.259 / 0.063 / - / 0.475 | 0.506 / 0.510 / 0.514 / 0.502 |

Why new items are matched: on a news log the clicks that follow a request hold many articles
published after it. Drawn freely, a negative was new (no click yet, so no code of any tier and no
counter) far more often than the clicked item, and a VM fed the serving tier learnt that: in a
Globo replay the rows with no item-level code had a CTR of 0.016-0.050 against 0.100 overall.
Matched, the known-item AUC (any click before the request) on Globo's 5% sample is 0.498, and on a
sparse log, where nearly every click is an item's first, new negatives stay as common as there.
Restricting negatives to items clicked before instead gave a known-item AUC of 0.009 on the sparse
synthetic log.

What is left, and why it is inside the band: on a news log some items clicked after the request
were published after it (no clicks yet), and a few items take most clicks while the clicked item
is never its own negative; both make a negative a little less popular than the clicked item (on
a 60-item catalogue with Pareto weights the popularity AUC reaches 0.66).

The pools read clicks up to ``max_window_hours`` after the request: the clicks that follow decide
which items are shown, as a logging policy that favours what is being clicked does; no model
feature reads them (every feature is as of the request). Clicks of the same log that other inputs
brought (``prior_clicks``: files overlapping in time) feed the pools too, so the hours two inputs
both hold draw what the whole log draws; an input's last hours draw only from the clicks ingested
so far. The draws are seeded hashes of (seed, request_id, draw), and the positions a seeded
shuffle of the K + 1 slots of a full list (a short list keeps gaps, so neither its length nor the
clicked item's slot shows in the position): the same input and seed always give the same requests
(``leak_statistics`` measures all three statistics on every ingest, and ``user_leak_statistics``
those of the user's side: the candidate's category against the user's last clicks, and whether the
user clicked it before).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from include.config import ClickLogConfig


def _hour(ts) -> F.Column:
    return (F.unix_seconds(ts) / 3600).cast("long")


def pool_windows(counts: dict[int, int], targets, params: ClickLogConfig) -> dict[int, int]:
    """Last hour of each target hour's pool: the pool is [hour, end], the own hour and the next one
    at least, widened forward until it holds ``min_pool_clicks`` events (``counts``: events per
    hour), no later than ``hour + max_window_hours``."""
    out = {}
    for hour in targets:
        end = hour + 1
        total = counts.get(hour, 0) + counts.get(end, 0)
        while total < params.min_pool_clicks and end - hour < params.max_window_hours:
            end += 1
            total += counts.get(end, 0)
        out[hour] = end
    return out


POOL_TYPE = "array<struct<us:bigint,user_id:string,item_id:string,first_us:bigint>>"


def click_pools(clicks: DataFrame, params: ClickLogConfig, targets: DataFrame | None = None) -> DataFrame:
    """(hour, pool, new_share): for each hour of ``targets`` (hour; default: the hours of ``clicks``), a seeded
    uniform sample of ``pool_size`` click *events* (us: the click's time in epoch microseconds,
    user_id, item_id, first_us: the item's first click in ``clicks``) of its window (module docstring), so an item is in the pool as often as its
    share of those clicks; the whole stream when it has fewer events. ``new_share``: the share of
    the hour's clicks that are their item's first click in ``clicks``. ``clicks`` needs
    ``user_id``, ``item_id`` and ``ts``.

    The windows are decided on the driver from the hourly counts (one row per hour of the log).
    """
    first = clicks.groupBy("item_id").agg(F.min(F.unix_micros("ts")).alias("first_us"))
    events = clicks.select("user_id", "item_id", "ts", _hour("ts").alias("click_hour")).join(first, "item_id")
    if targets is None:
        targets = events.select(F.col("click_hour").alias("hour"))
    hourly = events.groupBy("click_hour").agg(F.count("*").alias("n"),
                                               F.sum((F.unix_micros("ts") == F.col("first_us")).cast("long")).alias("new"))
    hourly = {r.click_hour: (r.n, r.new) for r in hourly.collect()}
    counts = {h: n for h, (n, _) in hourly.items()}
    hours = sorted(r.hour for r in targets.distinct().collect())
    if params.pool == "before":  # the first form: the whole hour before
        windows = {h: (h - 1, h - 1) for h in hours}
    else:
        windows = {h: (h, end) for h, end in pool_windows(counts, hours, params).items()}
    # (click_hour, hour): which pools each hour's events feed
    feeds = [(c, h) for h, (lo, hi) in windows.items() for c in range(lo, hi + 1) if c in counts]
    spark = clicks.sparkSession
    if not feeds:
        return spark.createDataFrame([], f"hour long, pool {POOL_TYPE}, new_share double")
    windowed = (events.join(F.broadcast(spark.createDataFrame(feeds, "click_hour long, hour long")), "click_hour")
                # an independent, seeded draw per target hour; the event's own fields make it repeatable
                .withColumn("h", F.xxhash64(F.lit(params.seed), "user_id", "item_id", F.unix_micros("ts"), "hour")))
    return (windowed.groupBy("hour")
            .agg(F.slice(F.array_sort(F.collect_list(F.struct("h", F.unix_micros("ts").alias("us"), "user_id", "item_id",
                                                                        "first_us"))),
                         1, params.pool_size).alias("sample"))
            .select("hour", F.expr("transform(sample, s -> named_struct('us', s.us, 'user_id', s.user_id, "
                                   "'item_id', s.item_id, 'first_us', s.first_us))").alias("pool"))
            # the share of the hour's clicks that are their item's first: how often a clicked item is new
            .join(F.broadcast(spark.createDataFrame([(h, new / n) for h, (n, new) in hourly.items()],
                                                    "hour long, new_share double")), "hour", "left")
            .fillna(0.0, ["new_share"]))


def leak_statistics(requests: DataFrame, clicks: DataFrame) -> dict[str, float]:
    """Single-feature AUCs on generated requests, a check that no one feature gives the label away,
    each as of the request's time, as the models read it: the item's clicks in the hour before
    (prior popularity), whether it had any click in the 24 hours before (recent click: what an
    item-level fallback or a "seen lately" counter exposes), whether it had any click before at all
    (known item: an item not yet published has no code of any tier), and the position. Near 0.5 is what
    unbiased candidates give; far from it means the data, not a model, separates the labels.
    ``clicks``: (item_id, ts) of every click the pools were drawn from.

    One shuffle puts each item's clicks and candidate rows in one partition; each partition counts,
    per row, the item's clicks strictly before it in each window by binary search over the sorted
    clicks and returns histograms only. (A Spark range window over the same rows recomputes its sum
    for every row, since a sum cannot take rows out of a sliding frame: on the whole Globo log, with
    tens of thousands of rows an hour for a popular item, that ran for most of an hour.)"""
    labelled = requests.where(F.col("label").isNotNull())
    hist = _histograms(_clicks_and_rows(clicks, labelled, "item_id"), "item_id", _window_histograms)
    positions = labelled.groupBy(F.col("position").cast("long").alias("value")).agg(
        F.sum("label").alias("pos"), F.sum(1 - F.col("label")).alias("neg")).collect()
    out = {}
    for name, stat in (("popularity_auc", "prior_clicks"), ("recent_click_auc", "recent_click"),
                       ("known_item_auc", "known_item"), ("position_auc", None)):
        out[name] = _auc(positions if stat is None else [r for r in hist if r.stat == stat])
    return out


CLICK = -1  # the label of a click row among the candidate rows in the histogram passes


def _clicks_and_rows(clicks: DataFrame, labelled: DataFrame, *keys: str) -> DataFrame:
    """The input of a histogram pass: ``clicks`` (label ``CLICK``) and the labelled candidate rows, as
    (keys..., us: the time in epoch microseconds, label)."""
    return (clicks.select(*keys, F.unix_micros("ts").alias("us"), F.lit(CLICK).alias("label"))
            .unionByName(labelled.select(*keys, F.unix_micros("ts").alias("us"), F.col("label").cast("int"))))


def _histograms(rows: DataFrame, key: str, per_partition) -> list:
    """``per_partition``'s (stat, value, pos, neg) histograms over ``rows`` shuffled by ``key`` (all
    rows of a key in one partition), summed over the partitions: the driver gets histograms only."""
    return (rows.repartition(key).mapInPandas(per_partition, "stat string, value long, pos long, neg long")
            .groupBy("stat", "value").agg(F.sum("pos").alias("pos"), F.sum("neg").alias("neg")).collect())


def _auc(rows) -> float:
    from model.metrics import auc_from_histogram

    return auc_from_histogram([r.value for r in rows], [r.pos for r in rows], [r.neg for r in rows])


def _histogram(stat: str, value, label):
    """One statistic's (stat, value, pos, neg) rows: per value, the positive and negative candidate rows."""
    import pandas as pd

    h = pd.DataFrame({"value": value, "pos": label, "neg": 1 - label}).groupby("value", as_index=False).sum()
    return h.assign(stat=stat)[["stat", "value", "pos", "neg"]]


def _window_histograms(batches):
    """Per partition (all rows of its items): for every candidate row (label 0 or 1), the item's
    clicks (label ``CLICK``) strictly before it in the hour before, in the 24 hours before and ever, as
    (stat, value, pos, neg) histograms."""
    import numpy as np
    import pandas as pd

    hour_us = 3600 * 10**6
    df = pd.concat(list(batches), ignore_index=True)
    if df.empty:
        return
    item = pd.factorize(df["item_id"])[0].astype(np.int64)
    # One sorted key per click: (item, time); an item's window is a range of keys.
    span = int(df["us"].max() - df["us"].min()) + 24 * hour_us + 1
    key = item * span + (df["us"].to_numpy(np.int64) - int(df["us"].min()) + 24 * hour_us)
    is_click = (df["label"] == CLICK).to_numpy()
    clicks = np.sort(key[is_click])
    rows, label = key[~is_click], df["label"][~is_click].to_numpy(np.int64)
    before = np.searchsorted(clicks, rows, side="left")  # clicks at keys < the row's
    start_of_item = np.searchsorted(clicks, rows - (rows % span), side="left")
    counts = {"prior_clicks": before - np.searchsorted(clicks, rows - hour_us, side="left"),
              "recent_click": (before - np.searchsorted(clicks, rows - 24 * hour_us, side="left") > 0).astype(np.int64),
              "known_item": (before - start_of_item > 0).astype(np.int64)}
    for stat, value in counts.items():
        yield _histogram(stat, value, label)


RECENT_CLICKS = 10  # the user-side check's "recent clicks": the user's last this many clicks before the request


def user_leak_statistics(requests: DataFrame, clicks: DataFrame, categories: DataFrame | None = None,
                         recent: int = RECENT_CLICKS) -> dict[str, float | None]:
    """The user's side of the leak check: single-feature AUCs, each as of the request's time, of
    what a model that reads the user's history sees of a candidate: its category is the category of
    the user's last click (same category), the share of the user's last ``recent`` clicks in its
    category (category share), and the user clicked it before (interacted before). A generator whose
    negatives are random items of the catalogue while the clicked item continues what the user was
    browsing gives the label away here, not on the item's side. ``clicks``: (user_id, item_id, ts) of
    the user's clicks; ``categories``: (item_id, category), or None. The two category statistics are
    None where no candidate has a known category (nothing to judge).

    One shuffle puts each user's clicks and candidate rows in one partition; each partition ranks
    them in time and counts by binary search, returning histograms only (as ``leak_statistics``)."""
    both = _clicks_and_rows(clicks, requests.where(F.col("label").isNotNull()), "user_id", "item_id")
    if categories is not None:
        known = categories.where(F.col("category").isNotNull()).select("item_id", "category").dropDuplicates(["item_id"])
        both = both.join(known, "item_id", "left")
    else:
        both = both.withColumn("category", F.lit(None).cast("string"))
    hist = _histograms(both, "user_id", lambda batches: _user_histograms(batches, recent))
    out = {}
    for name, stat in (("same_category_auc", "same_category"), ("category_share_auc", "category_share"),
                       ("interacted_before_auc", "interacted_before")):
        rows = [r for r in hist if r.stat == stat]
        out[name] = _auc(rows) if rows else None
    return out


def _user_histograms(batches, recent: int):
    """Per partition (all rows of its users): for every candidate row (label 0 or 1), from the user's
    clicks (label ``CLICK``) strictly before it: whether the last one's category is the row's
    (``same_category``), the share of the last ``recent`` in the row's category, in thousandths
    (``category_share``), and whether one was of the row's item (``interacted_before``); as (stat,
    value, pos, neg) histograms. Rows of an unknown category count in no category histogram.

    Every key is a dense code times a dense time rank, so nothing overflows whatever the log's span."""
    import numpy as np
    import pandas as pd

    df = pd.concat(list(batches), ignore_index=True)
    if df.empty:
        return
    n = len(df)
    t = np.unique(df["us"].to_numpy(np.int64), return_inverse=True)[1].astype(np.int64)  # time rank, < n
    user = pd.factorize(df["user_id"])[0].astype(np.int64)
    cat = pd.factorize(df["category"])[0].astype(np.int64)  # -1: unknown
    pair = pd.factorize(pd.MultiIndex.from_arrays([df["user_id"], df["item_id"]]))[0].astype(np.int64)
    is_click = (df["label"] == CLICK).to_numpy()
    row, label = ~is_click, df["label"][~is_click].to_numpy(np.int64)

    # The user's clicks in time order; a row's earlier clicks are positions [start, before) of it.
    key = user[is_click] * (n + 1) + t[is_click]
    order = np.argsort(key, kind="stable")
    click_key, click_user, click_cat = key[order], user[is_click][order], cat[is_click][order]
    before = np.searchsorted(click_key, user[row] * (n + 1) + t[row], side="left")
    start = np.searchsorted(click_key, user[row] * (n + 1), side="left")
    row_cat = cat[row]
    known = row_cat >= 0
    last_cat = np.full(len(before), -1, np.int64)  # -1: no click before (a partition may hold none at all)
    last_cat[before > start] = click_cat[before[before > start] - 1]
    same = (known & (last_cat == row_cat)).astype(np.int64)

    # The last ``recent`` clicks: positions [lo, before); those in the row's category, by a sorted
    # key of (user and category, position).
    lo = np.maximum(start, before - recent)
    m = len(click_key) + 1
    group = np.unique(np.r_[click_user * (n + 1) + click_cat + 1, user[row] * (n + 1) + row_cat + 1],
                      return_inverse=True)[1].astype(np.int64)
    click_group, row_group = group[:len(click_key)], group[len(click_key):]
    in_group = np.sort(click_group * m + np.arange(len(click_key)))
    hits = (np.searchsorted(in_group, row_group * m + before, side="left")
            - np.searchsorted(in_group, row_group * m + lo, side="left"))
    share = np.where(before > lo, np.rint(1000 * hits / np.maximum(before - lo, 1)), 0).astype(np.int64)

    # The user's clicks of the row's item, by (user and item, time).
    pair_clicks = np.sort(pair[is_click] * (n + 1) + t[is_click])
    seen = (np.searchsorted(pair_clicks, pair[row] * (n + 1) + t[row], side="left")
            - np.searchsorted(pair_clicks, pair[row] * (n + 1), side="left") > 0).astype(np.int64)

    for stat, value, keep in (("same_category", same, known), ("category_share", share, known),
                              ("interacted_before", seen, np.ones(len(seen), bool))):
        if keep.any():
            yield _histogram(stat, value[keep], label[keep])


def clicks_to_requests(clicks: DataFrame, params: ClickLogConfig, source: str,
                       prior_clicks: DataFrame | None = None) -> DataFrame:
    """One request per click, exploded to one row per candidate.

    ``clicks`` has user_id, item_id, ts and the context columns (surface, device, region,
    referrer); ``prior_clicks`` (user_id, item_id, ts) are clicks of the same log that other
    inputs brought, which feed the pools too.
    """
    recent = clicks.select("user_id", "item_id", "ts")
    if prior_clicks is not None:
        recent = recent.unionByName(prior_clicks.select("user_id", "item_id", "ts"))
    pools = click_pools(recent, params, targets=clicks.select(_hour("ts").alias("hour")))
    own = recent.select("user_id", "item_id", _hour("ts").alias("hour"))
    mine = (own.unionByName(own.withColumn("hour", F.col("hour") - 1))
            .groupBy("user_id", "hour").agg(F.collect_set("item_id").alias("mine")))

    k, seed = params.negatives_per_click, params.seed
    requests = (clicks
                .withColumn("request_id", F.concat_ws(":", F.lit(source), "user_id",
                                                      F.unix_millis("ts").cast("string"), "item_id"))
                .withColumn("hour", _hour("ts"))
                # what the user clicked in the hour and the next (a session's other clicks) is never a negative
                .join(mine, ["user_id", "hour"], "left")
                .withColumn("mine", F.coalesce("mine", F.array().cast("array<string>")))
                # The pools last, broadcast: a row that carries its hour's pool (pool_size events) must
                # not cross a shuffle (on the whole Globo log that was ~150 GB of shuffle files).
                .join(F.broadcast(pools), "hour", "left")
                .withColumn("pool", F.coalesce("pool", F.array().cast(POOL_TYPE)))
                .fillna(0.0, ["new_share"]))
    # Successive draws from the pool's events (each an index by a seeded hash of the request and the
    # draw), skipping the clicked item, the user's own clicks and items drawn already, until K
    # distinct: K draws without replacement, each in proportion to the item's clicks in the pool.
    # 4K draws leave fewer than K only when a handful of items hold nearly all of the pool's clicks
    # (or a thin hour has fewer than K others). Constant work per request,
    # whatever the pool size (sorting the whole pool per request made a large log's ingest hours long).
    draws = 4 * k
    after = "x.us > unix_micros(ts) AND " if params.pool == "after" else ""
    requests = requests.withColumn("eligible", F.expr(
        f"filter(transform(sequence(0, {draws - 1}), j -> try_element_at(pool, cast(pmod(xxhash64({seed}, request_id, j), "
        f"greatest(size(pool), 1)) AS INT) + 1)), x -> x IS NOT NULL AND {after}x.item_id != item_id AND x.user_id != user_id "
        f"AND NOT array_contains(mine, x.item_id))"))
    if params.match_new_items:
        # New items (never clicked before the request: on a news log, mostly not yet published) take
        # as many of the K slots as the hour's clicks are first clicks, each slot new with that
        # probability by a seeded hash; the rest are items clicked before. A clicked item is new as
        # often as its hour says, so "new" (no code of any tier, no counter) says nothing about the
        # label on a dense news log, where the clicks that follow hold many just-published items,
        # nor on a sparse one, where nearly every click is an item's first. A stratum that runs
        # short is filled from the other.
        distinct = "slice(array_distinct(transform(filter(eligible, x -> x.first_us {} unix_micros(ts)), x -> x.item_id)), 1, {})"
        requests = (requests.withColumn("fresh", F.expr(distinct.format(">=", k)))
                    .withColumn("known", F.expr(distinct.format("<", k)))
                    .withColumn("n_new", F.expr(f"size(filter(sequence(1, {k}), j -> pmod(xxhash64({seed}, request_id, "
                                                f"'new', j), 1000000) < new_share * 1000000))")))
        negatives = F.expr(f"slice(concat(slice(fresh, 1, n_new), known, slice(fresh, n_new + 1, {k})), 1, {k})")
    else:
        negatives = F.expr(f"slice(array_distinct(transform(eligible, x -> x.item_id)), 1, {k})")
    requests = requests.withColumn("negatives", negatives)
    # Slots: a seeded shuffle of the K + 1 slots of a full list; the clicked item takes the first, the
    # negatives the next ones. A short list (a thin hour) keeps gaps rather than packing its items at
    # the top, so a positive and a negative have the same slot distribution whatever the list's
    # length, and the position says nothing about the label.
    slots = F.expr(f"transform(array_sort(transform(sequence(0, {k}), j -> named_struct('h', xxhash64({seed}, request_id, "
                   f"'slot', j), 'j', j))), s -> s.j)")
    requests = (requests.withColumn("clicked", F.col("item_id"))
                .withColumn("candidates", F.arrays_zip(F.concat(F.array("item_id"), "negatives").alias("item_id"),
                                                       F.slice(slots, 1, F.size("negatives") + 1).alias("position"))))
    rows = requests.select("request_id", "user_id", "clicked", "ts", "surface", "device", "region", "referrer",
                           F.explode("candidates").alias("c")).select("*", "c.item_id", "c.position").drop("c")
    return rows.select(
        "request_id", "user_id", "item_id", "ts", "position",
        F.when(F.col("item_id") == F.col("clicked"), 1).otherwise(0).alias("label"),
        "surface", "device", "region", "referrer",
        F.lit(source).alias("source"),
        F.to_date("ts").alias("date"),
        F.hour("ts").alias("hour"),
    )
