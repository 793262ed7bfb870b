"""Embed the selected pairs with the FM + autoencoder as of t, and MERGE them into pair_embeddings.

FM inputs are built as of t: each user's last L events strictly before t. Inference runs in
batches inside Spark (``mapInPandas``; the models load once per Python worker) on the configured
device. Rows get computed_at = t and expires_at = t + TTL, so rerunning an interval writes the
same rows. Embeddings of the wrong dimension or with NaN are rejected before the MERGE.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


def histories(events: DataFrame, users: DataFrame, t: datetime, length: int) -> DataFrame:
    """(user_id, history): the user's last ``length`` item ids strictly before t, oldest first; pure."""
    w = Window.partitionBy("user_id").orderBy(F.col("ts").desc(), F.col("item_id").desc())
    last = (events.where(F.col("ts") < F.lit(t)).join(users, "user_id", "left_semi")
            .withColumn("_n", F.row_number().over(w)).where(F.col("_n") <= length))
    return (last.groupBy("user_id")
            .agg(F.sort_array(F.collect_list(F.struct("ts", "item_id"))).alias("_h"))
            .select("user_id", F.transform("_h", lambda s: s["item_id"]).alias("history")))


def embed(selected: DataFrame, fm_path: str, ae_path: str, t: datetime, device: str = "cpu") -> DataFrame:
    """Add ``embedding`` (array<float>) to rows with user_id, item_id, device, surface, history."""
    import pandas as pd

    def run(batches):
        from model.inference import fm_codes

        for pdf in batches:
            codes = fm_codes(pdf.assign(ts=pd.Timestamp(t)), fm_path, ae_path, device=device)
            yield pd.DataFrame({"user_id": pdf["user_id"], "item_id": pdf["item_id"], "embedding": list(codes)})

    return selected.mapInPandas(run, "user_id string, item_id string, embedding array<float>")


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
