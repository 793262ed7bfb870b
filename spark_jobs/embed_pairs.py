"""FM inputs as of t in Spark, FM inference, and the rows precompute MERGEs into pair_embeddings.

The FM reads, for a (user, item) pair at t, what training built for a request at t
(``model.features``): the user's last L events in [t - horizon, t) with their categories and
times, the item's category and subcategory, the item's clicks in the last hour and day and its
first click in the horizon, and the user's clicks on the item's category and in all. Here they
are Spark aggregates over ``user_events`` bounded by the horizon (no scan of older events), joined
to the pairs; ``model.inference`` turns them into model inputs with the same functions training
uses (tests/test_precompute.py checks that both give the same inputs).

Inference runs inside Spark (``mapInPandas``; the models load once per Python worker), the pairs
of a user kept together so that the user's history is encoded once. Rows get computed_at = t and
expires_at = t + TTL, so rerunning an interval writes the same rows. Embeddings of the wrong
dimension or with NaN are rejected before the MERGE.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from model.interface import BUILTIN_FM


def in_horizon(events: DataFrame, t: datetime, horizon_hours: float) -> DataFrame:
    """Events in [t - horizon, t): all that any FM input as of t reads."""
    return events.where((F.col("ts") < F.lit(t)) & (F.col("ts") >= F.lit(t - timedelta(hours=horizon_hours))))


def histories(events: DataFrame, users: DataFrame, t: datetime, length: int, horizon_hours: float,
              items: DataFrame | None = None) -> DataFrame:
    """(user_id, history, history_category, history_ts): the user's last ``length`` events in
    [t - horizon, t), oldest first (ties in time by item id); pure."""
    w = Window.partitionBy("user_id").orderBy(F.col("ts").desc(), F.col("item_id").desc())
    last = (in_horizon(events, t, horizon_hours).join(users, "user_id", "left_semi")
            .withColumn("_n", F.row_number().over(w)).where(F.col("_n") <= length))
    if items is not None:
        last = last.join(items.select("item_id", "category"), "item_id", "left")
    else:
        last = last.withColumn("category", F.lit(None).cast("string"))
    h = (last.groupBy("user_id")
         .agg(F.sort_array(F.collect_list(F.struct("ts", "item_id", "category"))).alias("_h")))
    return h.select("user_id", F.transform("_h", lambda s: s["item_id"]).alias("history"),
                    F.transform("_h", lambda s: s["category"]).alias("history_category"),
                    F.transform("_h", lambda s: s["ts"]).alias("history_ts"))


def item_counts(events: DataFrame, t: datetime, horizon_hours: float) -> DataFrame:
    """(item_id, clicks_1h, clicks_24h, age_hours): click events of the item in the last hour and
    day before t, and hours since its first click in the horizon."""
    clicks = in_horizon(events, t, horizon_hours).where(F.col("event_type") == "click")
    t_us = F.unix_micros(F.lit(t).cast("timestamp"))
    return clicks.groupBy("item_id").agg(
        F.sum((F.col("ts") >= F.lit(t - timedelta(hours=1))).cast("long")).alias("clicks_1h"),
        F.sum((F.col("ts") >= F.lit(t - timedelta(hours=24))).cast("long")).alias("clicks_24h"),
        ((t_us - F.unix_micros(F.min("ts"))) / F.lit(3_600_000_000.0)).alias("age_hours"))


def user_counts(events: DataFrame, users: DataFrame, items: DataFrame | None, t: datetime,
                horizon_hours: float) -> tuple[DataFrame, DataFrame]:
    """((user_id, user_total), (user_id, category, user_category)): the user's events in the
    horizon, in all and per item category (events of items without a category count in all only)."""
    mine = in_horizon(events, t, horizon_hours).join(users, "user_id", "left_semi")
    totals = mine.groupBy("user_id").agg(F.count(F.lit(1)).alias("user_total"))
    if items is None:
        return totals, totals.select("user_id", F.lit(None).cast("string").alias("category"),
                                     F.lit(0).cast("long").alias("user_category")).limit(0)
    per_cat = (mine.join(items.select("item_id", "category"), "item_id")
               .where(F.col("category").isNotNull())
               .groupBy("user_id", "category").agg(F.count(F.lit(1)).alias("user_category")))
    return totals, per_cat


def with_fm_inputs(pairs: DataFrame, events: DataFrame, items: DataFrame | None, t: datetime, length: int,
                   horizon_hours: float, groups=("context", "attributes", "counters", "history")) -> DataFrame:
    """``pairs`` (user_id, item_id, ...) with the columns of ``model.inference.PAIR_COLUMNS`` that the
    FM's input ``groups`` read (model.interface), as of t: no scan of events for what it does not read."""
    users = pairs.select("user_id").distinct()
    attrs = (items.select("item_id", "category", "subcategory") if items is not None else
             pairs.select("item_id").distinct().select("item_id", F.lit(None).cast("string").alias("category"),
                                                       F.lit(None).cast("string").alias("subcategory")))
    out = pairs
    if "attributes" in groups or "counters" in groups:  # the user's per-category counters join on the category
        out = out.join(attrs, "item_id", "left")
    if "counters" in groups:
        totals, per_cat = user_counts(events, users, items, t, horizon_hours)
        out = (out.join(item_counts(events, t, horizon_hours), "item_id", "left")
               .join(totals, "user_id", "left")
               .join(per_cat, ["user_id", "category"], "left"))
    if "history" in groups:
        out = out.join(histories(events, users, t, length, horizon_hours, items), "user_id", "left")
    return out


def embed(pairs: DataFrame, fm_path: str, ae_path: str, t: datetime, device: str = "cpu",
          allowed: frozenset[str] = frozenset({BUILTIN_FM}), task_gpus: float = 0.0) -> DataFrame:
    """(user_id, item_id, embedding array<float>) of rows with ``with_fm_inputs``'s columns. The
    pairs of a user stay in one partition, together, so the user's history is encoded once.
    ``task_gpus`` > 0: each task of this stage asks Spark for that much of a GPU (a stage-level
    resource profile; the cluster's executors hold them, ``[spark] executor_gpus``) and runs on the
    address it is given (``task_device``); ``device`` is then what a task without one uses."""
    import pandas as pd

    def run(batches):
        from model.inference import fm_codes

        on = task_device(device)
        for pdf in batches:
            codes = fm_codes(pdf.assign(ts=pd.Timestamp(t)), fm_path, ae_path, device=on, allowed=allowed)
            yield pd.DataFrame({"user_id": pdf["user_id"], "item_id": pdf["item_id"], "embedding": list(codes)})

    grouped = pairs.repartition("user_id").sortWithinPartitions("user_id", "item_id")
    return grouped.mapInPandas(run, "user_id string, item_id string, embedding array<float>",
                               profile=gpu_profile(task_gpus) if task_gpus else None)


def fm_device(cfg) -> tuple[str, float]:
    """(device, task_gpus) for a stage that runs the FM: with ``[spark] executor_gpus`` each task runs
    on the GPU Spark assigns it (the driver may have none); else ``[models] device``, decided on the
    driver, where a cuda request without a GPU fails early."""
    if cfg.spark.executor_gpus:
        return "cpu", cfg.spark.task_gpus
    from model.train import pick_device

    return str(pick_device(cfg.models.device)), 0.0


def gpu_profile(task_gpus: float):
    """A stage-level profile whose tasks each need ``task_gpus`` of a GPU (and one core), so Spark
    runs them only where a GPU is free and tells each which one (TaskContext.resources)."""
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    return ResourceProfileBuilder().require(TaskResourceRequests().cpus(1).resource("gpu", task_gpus)).build


def task_device(fallback: str = "cpu") -> str:
    """Inside a Spark task: ``cuda:<address>`` of the GPU Spark assigned it, or the CPU where torch
    sees no GPU (a fake or absent device); a task that was given none runs on ``fallback``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    gpus = ctx.resources().get("gpu") if ctx is not None else None
    if gpus is None or not gpus.addresses:
        return fallback
    import torch

    return f"cuda:{gpus.addresses[0]}" if torch.cuda.is_available() else "cpu"


def check_embeddings(df: DataFrame, dim: int) -> None:
    """Raise before anything is written if an embedding has the wrong size or a NaN/inf value."""
    from feature_store.quality import valid_embedding

    bad = df.where(~valid_embedding(dim)).limit(5).collect()
    if bad:
        sizes = sorted({len(r.embedding) for r in bad})
        raise ValueError(f"rejected before MERGE: embeddings with wrong dimension or NaN/inf "
                         f"(expected {dim} finite floats; saw sizes {sizes}, e.g. pair ({bad[0].user_id}, {bad[0].item_id}))")


def to_rows(embedded: DataFrame, t: datetime, ttl_hours: float, model_version: str, run_id: str) -> DataFrame:
    return embedded.select("user_id", "item_id", "embedding", F.lit(model_version).alias("model_version"),
                           F.lit(t).cast("timestamp").alias("computed_at"),
                           F.lit(t + timedelta(hours=ttl_hours)).cast("timestamp").alias("expires_at"),
                           F.lit(run_id).alias("run_id"))
