"""One speculative precompute run for the interval ending at t: speculate -> verify -> embed ->
MERGE -> take in the miss queue -> expire and vacuum -> record counters.

    python -m spark_jobs.precompute --at 2026-01-05T12:00:00 [--config F]
    spark-submit --properties-file lake/spark-solaris.conf spark_jobs/precompute.py --at ...

t comes from the arguments, never the clock, and every write is keyed by the run: rerunning an
interval leaves the same tables. Each table write is one Delta transaction, so a run killed midway
leaves every table at its previous version or its new one, never half-written.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

from pyspark.sql import functions as F

from feature_store.tables import (ITEMS, MISS_CONSUMPTION, MISS_QUEUE, PAIR_EMBEDDINGS, PRECOMPUTE_RUNS, REQUEST_LOG, USER_EVENTS,
                                  VERIFIER_SCORES, conform, ensure_tables, in_time_range, qualified_name)
from feature_store import lake
from include.cli import run_at_time
from spark_jobs import embed_pairs, miss_queue, speculate


@dataclass(frozen=True)
class RunCounters:
    run_id: str
    interval_start: datetime
    interval_end: datetime
    pairs_considered: int
    pairs_scored: int
    pairs_selected: int
    already_fresh: int
    pairs_embedded: int
    expired_removed: int
    queue_in: int
    queue_waiting: int
    queue_pruned: int
    vm_version: str
    fm_version: str
    seconds: float
    rollout_code_version: str | None = None  # the consumers' code space, also written during a rollout
    stage_seconds: tuple[tuple[str, float], ...] = ()  # printed, not stored: where the time went

    def lines(self) -> list[str]:
        return [f"precompute run {self.run_id} (window {self.interval_start} .. {self.interval_end}) in {self.seconds:.1f} s",
                *(f"  {k:<18} {v:>12,}" for k, v in asdict(self).items() if isinstance(v, int)),
                f"  verifier {self.vm_version}; embeddings by {self.fm_version}"
                + (f", and by {self.rollout_code_version} for its consumers (rollout)" if self.rollout_code_version else ""),
                "  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in self.stage_seconds)]

    def row(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "stage_seconds"}


class Laps:
    """Seconds per stage of a run, in order: ``lap(name)`` closes the stage that began at the last lap."""

    def __init__(self):
        self.started = self.mark = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages.append((name, now - self.mark))
        self.mark = now


def run(spark, cfg, t: datetime) -> RunCounters:
    from model import interface, registry

    laps = Laps()
    pc, db = cfg.precompute, cfg.lake.database
    start = speculate.window_start(pc, t)
    models = registry.resolve_models(cfg)  # fails here, before any work, if a checkpoint is missing
    run_id = lake.run_id(t)
    ensure_tables(spark, cfg, (PRECOMPUTE_RUNS,))
    spaces = written_spaces(spark, cfg, t)  # the code spaces this run writes: the newest, and in a rollout the consumers'
    fm_version = spaces.newest
    rollout_version = next((v for v in spaces.models if v != fm_version), None)
    writers = code_writers(cfg, spaces)
    interface.vm_class(registry.stored_class(models["vm"]), cfg.allowed_classes)  # and the verifier's
    specs = (REQUEST_LOG, USER_EVENTS, ITEMS, PAIR_EMBEDDINGS, VERIFIER_SCORES, MISS_QUEUE, MISS_CONSUMPTION,
             PRECOMPUTE_RUNS)
    ensure_tables(spark, cfg, specs)
    laps.lap("setup")
    name = {s.name: qualified_name(s, db) for s in specs}

    # Waiting misses, plus those this same run took in before (a rerun must see the same queue).
    queue = miss_queue.waiting(spark, db, before=t, run_id=run_id)
    audit = speculate_and_audit(spark, cfg, t, name, queue, models["vm"], fm_version)
    laps.lap("speculate+verify")

    selected = audit.where("selected").select("user_id", "item_id", "device", "surface")
    n_embedded = embed_and_merge(spark, cfg, t, name, selected, writers, laps)
    laps.lap("merge")

    miss_queue.consume(spark, cfg, queue, audit.where(F.col("origin") == "miss_queue"), run_id)
    pruned = miss_queue.prune(cfg, t - timedelta(hours=pc.queue_retention_hours))
    laps.lap("miss queue")
    expired = expire(spark, cfg, t)
    laps.lap("expire+vacuum")
    counts = audit.agg(F.count(F.lit(1)).alias("scored"), F.sum(F.col("selected").cast("int")).alias("selected"),
                       F.sum(((~F.col("selected")) & F.col("fresh_until").isNotNull()
                              & (F.col("fresh_until") > F.lit(t + timedelta(minutes=pc.fresh_margin_minutes)))
                              ).cast("int")).alias("fresh"),
                       F.sum((F.col("origin") == "miss_queue").cast("int")).alias("queue_in")).first()
    waiting = miss_queue.waiting(spark, db).count()
    counters = RunCounters(run_id=run_id, interval_start=start, interval_end=t,
                           pairs_considered=counts.scored, pairs_scored=counts.scored,
                           pairs_selected=counts.selected or 0, already_fresh=counts.fresh or 0,
                           pairs_embedded=n_embedded, expired_removed=expired, queue_in=counts.queue_in or 0,
                           queue_waiting=waiting, queue_pruned=pruned, vm_version="/".join(models["vm"].rsplit("/", 2)[-2:]),
                           fm_version=fm_version, seconds=round(time.perf_counter() - laps.started, 2),
                           rollout_code_version=rollout_version)
    row = conform(spark.createDataFrame([counters.row()], PRECOMPUTE_RUNS.schema()), PRECOMPUTE_RUNS)
    lake.upsert(spark, cfg, PRECOMPUTE_RUNS, row)
    laps.lap("counters")
    return replace(counters, stage_seconds=tuple(laps.stages))


def code_writers(cfg, spaces) -> dict:
    """code space -> (its model paths, its FM class, its code size): each checked before any work,
    failing here if an autoencoder does not match its config or the config does not allow an FM's class."""
    from model import interface, registry
    from model.autoencoder import AEConfig, EmbeddingAutoencoder

    writers = {}
    for version, paths in spaces.models.items():
        ae = registry.load(paths["autoencoder"], EmbeddingAutoencoder, AEConfig)
        fm_cls = interface.fm_class(registry.stored_class(paths["fm"]), cfg.allowed_classes)
        writers[version] = (paths, fm_cls, ae.cfg.code_dim)
    return writers


def speculate_and_audit(spark, cfg, t: datetime, name: dict, queue, verifier: str, fm_version: str):
    """Score the window's candidates and the waiting misses with the verifier VM, select the budget,
    and replace the run's partition of ``verifier_scores`` with every pair scored: the audit, which
    the rest of the run reads back (the selection is decided once, and a rerun decides it again)."""
    pc, run_id = cfg.precompute, lake.run_id(t)
    window = in_time_range(spark.table(name["request_log"]), speculate.window_start(pc, t), t)
    # Fresh = computed before t and still valid after it. Rows computed at t are this run's own
    # (from an earlier attempt at the same interval); counting them would make a rerun differ.
    # Fresh in the newest code space: in a rollout a pair the consumers' space has fresh is chosen
    # anew, and written in both.
    fresh = spark.table(name["pair_embeddings"]) \
        .where((F.col("computed_at") < F.lit(t)) & (F.col("expires_at") > F.lit(t))
               & (F.col("model_version") == F.lit(fm_version))) \
        .select("user_id", "item_id", "expires_at")
    scored = speculate.score(speculate.candidates(window, queue, pc), verifier, t, cfg.allowed_classes).persist()
    try:
        decided = speculate.select(scored, fresh, pc, t)
        lake.replace(cfg, VERIFIER_SCORES, conform(decided.withColumn("run_id", F.lit(run_id)), VERIFIER_SCORES),
                     f"run_id = '{run_id}'")
    finally:
        scored.unpersist()
    return spark.table(name["verifier_scores"]).where(F.col("run_id") == run_id)


def embed_and_merge(spark, cfg, t: datetime, name: dict, selected, writers: dict, laps: Laps) -> int:
    """The selected pairs' FM inputs as of t, the FM and autoencoder run in every code space written,
    the codes checked (size, finite) and MERGEd into ``pair_embeddings``; returns the rows written."""
    from model import registry

    device, task_gpus = embed_pairs.fm_device(cfg)
    run_id, rows = lake.run_id(t), None
    for version, (paths, fm_cls, _) in writers.items():
        fm_cfg = registry.read_json(paths["fm"], "config.json")["config"]
        pairs = embed_pairs.with_fm_inputs(selected, spark.table(name["user_events"]), spark.table(name["items"]), t,
                                           fm_cfg["history_len"], fm_cfg["horizon_hours"], fm_cls.inputs)
        embedded = embed_pairs.embed(pairs, paths["fm"], paths["autoencoder"], t, device, cfg.allowed_classes,
                                     task_gpus)
        written = embed_pairs.to_rows(embedded, t, cfg.precompute.ttl_hours, version, run_id)
        rows = written if rows is None else rows.unionByName(written)
    rows = rows.persist()
    try:
        for version, (_, _, code_dim) in writers.items():
            embed_pairs.check_embeddings(rows.where(F.col("model_version") == version), code_dim)
        n_embedded = rows.count()
        laps.lap("embed")  # the FM inputs built, the FM and autoencoder run: the rows are cached here
        lake.upsert(spark, cfg, PAIR_EMBEDDINGS, rows)
    finally:
        rows.unpersist()
    return n_embedded


def written_spaces(spark, cfg, t: datetime):
    """The code spaces the run at t writes (``model.registry.CodeSpaces``): in a rollout, the
    consumers' beside the newest until ``[models] rollout_overlap_hours`` after the first run that
    wrote the newest one (from ``precompute_runs``: a rerun decides the same)."""
    from model import registry

    spaces = registry.code_spaces(cfg)
    if len(spaces.models) < 2:
        return spaces
    first = (spark.table(qualified_name(PRECOMPUTE_RUNS, cfg.lake.database))
             .where((F.col("fm_version") == spaces.newest) & (F.col("interval_end") < F.lit(t)))
             .agg(F.min("interval_end")).first()[0])
    overlap = timedelta(hours=cfg.models.rollout_overlap_hours)
    if first is not None and t - first >= overlap:
        return replace(spaces, models={spaces.newest: spaces.models[spaces.newest]},
                       reason=f"rollout past its overlap ({overlap} since {first}): only the newest code space is written")
    return spaces


def expire(spark, cfg, t: datetime) -> int:
    """Delete rows expired at t and, every ``vacuum_every_hours``, vacuum old files. Readers filter
    on expires_at regardless of cleanup."""
    from delta.tables import DeltaTable

    table = DeltaTable.forName(spark, qualified_name(PAIR_EMBEDDINGS, cfg.lake.database))
    n = table.toDF().where(F.col("expires_at") <= F.lit(t)).count()
    if n:
        lake.delete_expired(spark, cfg, PAIR_EMBEDDINGS, t)
    every = cfg.precompute.vacuum_every_hours
    # VACUUM lists every file of the table: the most expensive step of a run, and needed far less
    # often than hourly. Whether it runs follows from t, not the clock, so reruns do the same.
    if every <= 0 or ((t - datetime(1970, 1, 1)) // timedelta(hours=1)) % every:
        return n
    hours = cfg.precompute.vacuum_retention_hours
    if hours < 168:  # Delta refuses short retention unless told the readers can take it
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # Delta 4 reads the retention from the table property, not from vacuum()'s argument.
    wanted = f"interval {hours} hours"
    if table.detail().first()["properties"].get("delta.deletedFileRetentionDuration") != wanted:
        spark.sql(f"ALTER TABLE {qualified_name(PAIR_EMBEDDINGS, cfg.lake.database)} SET TBLPROPERTIES "
                  f"('delta.deletedFileRetentionDuration' = '{wanted}')")
    table.vacuum()
    return n


def main(argv: list[str] | None = None) -> int:
    return run_at_time(argv, "spark_jobs.precompute", __doc__.split("\n\n")[0], run, lambda c: print("\n".join(c.lines())))


if __name__ == "__main__":
    sys.exit(main())
