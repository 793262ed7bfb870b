"""Every SOLARIS table, declared once.

Jobs, data-quality checks, the online lookup and the docs read these declarations; a table is
created from its declaration (``ensure_table``) as an external Delta table under the lake root,
so Spark finds it by name (``solaris.request_log``) and delta-rs finds it by path.

All timestamps are UTC. ``expiry`` says what a row's lifetime means for readers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: tuple[tuple[str, str, str], ...]  # (name, Spark SQL type, comment)
    primary_key: tuple[str, ...]
    partition_by: tuple[str, ...] = ()
    description: str = ""
    expiry: str = "rows never expire"

    @property
    def ddl(self) -> str:
        """Column list in Spark SQL DDL, e.g. ``user_id STRING NOT NULL, ts TIMESTAMP``."""
        return ", ".join(f"{n} {t}" for n, t, _ in self.columns)

    @property
    def column_names(self) -> list[str]:
        return [n for n, _, _ in self.columns]

    def schema(self):
        from pyspark.sql.types import StructType

        return StructType.fromDDL(self.ddl)


REQUEST_LOG = TableSpec(
    name="request_log",
    description="One row per candidate shown in a ranking request: what was served, and the click label.",
    columns=(
        ("request_id", "STRING", "unique per request across sources: '<source>:<id>'"),
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("ts", "TIMESTAMP", "request time, UTC"),
        ("position", "INT", "0-based slot of the candidate in the request"),
        ("label", "INT", "1 clicked, 0 shown and not clicked, NULL unknown"),
        ("surface", "STRING", "where the request came from (page, app environment)"),
        ("device", "STRING", "device group, when the log has it"),
        ("region", "STRING", "region, when the log has it"),
        ("referrer", "STRING", "referrer type, when the log has it"),
        ("source", "STRING", "which ingested log the row came from (mind, globo, synthetic, ...)"),
        ("date", "DATE", "partition: UTC date of ts"),
        ("hour", "INT", "partition: UTC hour of ts"),
        ("input_path", "STRING", "the file or folder the row was ingested from; an ingest rewrites only its own input's rows"),
        ("conversion", "INT", "second label: 1 converted after the click, 0 not, NULL unknown (logs without it)"),
    ),
    primary_key=("request_id", "item_id"),
    partition_by=("date", "hour"),
)

USER_EVENTS = TableSpec(
    name="user_events",
    description="Positive interactions (clicks, and MIND's pre-log history) that history features read.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("ts", "TIMESTAMP", "event time, UTC; MIND history events are placed before the log, in order"),
        ("event_type", "STRING", "'click' or 'history' (MIND's clicks before the log window)"),
        ("source", "STRING", "which ingested log the row came from"),
        ("date", "DATE", "partition: UTC date of ts"),
        ("input_path", "STRING", "the file or folder the row was ingested from; an ingest rewrites only its own input's rows"),
    ),
    primary_key=("user_id", "item_id", "ts", "event_type"),
    partition_by=("date",),
)

ITEMS = TableSpec(
    name="items",
    description="Item attributes where the source provides them; most logs cover only part of their items.",
    columns=(
        ("item_id", "STRING", "source item id"),
        ("category", "STRING", "top-level category"),
        ("subcategory", "STRING", "finer category"),
        ("title", "STRING", "title text"),
        ("source", "STRING", "which ingested log the row came from"),
    ),
    primary_key=("item_id",),
)

TRUTH = TableSpec(
    name="truth",
    description="Known click and conversion probabilities of a simulated log's impressions. Only the evaluation reads "
                "it (the Bayes NE: the NE of predicting the truth); no training or serving code does.",
    columns=(
        ("request_id", "STRING", "request, as in request_log"),
        ("item_id", "STRING", "candidate"),
        ("p_click", "DOUBLE", "the probability the click label was drawn with"),
        ("p_conversion", "DOUBLE", "the probability of a click followed by a conversion"),
        ("source", "STRING", "which ingested log"),
        ("input_path", "STRING", "the impression file it belongs to"),
    ),
    primary_key=("request_id", "item_id"),
)

REQUEST_LOG_QUARANTINE = TableSpec(
    name="request_log_quarantine",
    description="Input records that could not be ingested, kept whole with the reason; nothing is dropped silently.",
    columns=(
        ("raw", "STRING", "the record as read (line text, or the parsed fields as JSON)"),
        ("source", "STRING", "which log the record came from"),
        ("input_path", "STRING", "the file or folder that was ingested"),
        ("reason", "STRING", "why the record was not ingested: a stable category, for GROUP BY reason"),
        ("ingested_at", "TIMESTAMP", "when the ingest run saw it, UTC"),
        ("value", "STRING", "the offending value or detail, where the reason has one (NULL otherwise)"),
    ),
    primary_key=("source", "input_path", "raw", "reason"),
    partition_by=("source",),
)

INGEST_RUNS = TableSpec(
    name="ingest_runs",
    description="One row per ingest run: rows in, rows written per table, rows quarantined.",
    columns=(
        ("run_id", "STRING", "source plus input path plus the ingested time range"),
        ("source", "STRING", "which log"),
        ("input_path", "STRING", "what was read"),
        ("records_in", "BIGINT", "records read from the input"),
        ("request_rows", "BIGINT", "rows written to request_log"),
        ("requests", "BIGINT", "distinct requests written"),
        ("event_rows", "BIGINT", "rows written to user_events"),
        ("item_rows", "BIGINT", "rows written to items"),
        ("quarantined", "BIGINT", "records written to request_log_quarantine"),
        ("min_ts", "TIMESTAMP", "earliest request time ingested"),
        ("max_ts", "TIMESTAMP", "latest request time ingested"),
        ("seconds", "DOUBLE", "wall time of the run"),
        ("finished_at", "TIMESTAMP", "when the run committed, UTC"),
        ("popularity_auc", "DOUBLE", "generated candidates: AUC of the item's clicks in the prior hour alone; 0.5 no leak"),
        ("position_auc", "DOUBLE", "generated candidates: AUC of the position alone; 0.5 no leak"),
        ("recent_click_auc", "DOUBLE", "generated candidates: AUC of the item having any click in the 24 h before alone; 0.5 no leak"),
        ("known_item_auc", "DOUBLE", "generated candidates: AUC of the item having any click before the request alone; 0.5 no leak"),
        ("same_category_auc", "DOUBLE", "generated candidates: AUC of the item's category being the user's last click's alone; 0.5 no leak"),
        ("category_share_auc", "DOUBLE", "generated candidates: AUC of the share of the user's last 10 clicks in the item's category alone; 0.5 no leak"),
        ("interacted_before_auc", "DOUBLE", "generated candidates: AUC of the user having clicked the item before alone; 0.5 no leak"),
        ("candidates", "STRING", "generated (a click log: SOLARIS drew the negatives; the leak check judges them) or logged"),
        ("events_already_present", "BIGINT", "events of the input already in user_events from another input (kept once)"),
    ),
    primary_key=("run_id",),
)

PAIR_EMBEDDINGS = TableSpec(
    name="pair_embeddings",
    description="Precomputed, compressed FM interaction embeddings of speculated (user, item) pairs.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        # float32: Spark, Delta and Arrow have no half-precision array type, and at C=32 a pair
        # costs 128 bytes either way small next to the keys; readers keep it float32 in memory.
        ("embedding", "ARRAY<FLOAT>", "autoencoder code of the FM interaction embedding (C floats)"),
        ("model_version", "STRING", "code space: fm and autoencoder versions and weight digests that computed it"),
        ("computed_at", "TIMESTAMP", "end of the precompute interval whose history it used, UTC"),
        ("expires_at", "TIMESTAMP", "computed_at + TTL; never served at or after this time"),
        ("run_id", "STRING", "precompute run that wrote it"),
    ),
    primary_key=("user_id", "item_id", "model_version"),  # one row per pair and code space
    expiry="a row is valid for t in [computed_at, expires_at); readers filter at read time, cleanup deletes later",
)

VERIFIER_SCORES = TableSpec(
    name="verifier_scores",
    description="Every candidate pair a precompute run scored with the verifier VM, and whether it was selected.",
    columns=(
        ("run_id", "STRING", "precompute run: interval end in UTC, e.g. 2026-01-05T12:00:00"),
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("origin", "STRING", "'speculated' (active user x recent/trending item) or 'miss_queue'"),
        ("device", "STRING", "the user's latest device in the look-back window (model context)"),
        ("surface", "STRING", "the user's latest surface in the look-back window (model context)"),
        ("score", "DOUBLE", "verifier VM click probability"),
        ("score_rank", "BIGINT", "1 = highest score in the run (or in the user, per-user selection)"),
        ("fresh_until", "TIMESTAMP", "expires_at of the stored embedding when the run started, if any"),
        ("selected", "BOOLEAN", "in the precompute set (top budget share and not already fresh)"),
    ),
    primary_key=("run_id", "user_id", "item_id"),
    partition_by=("run_id",),
)

MISS_QUEUE = TableSpec(
    name="miss_queue",
    description="Pairs requested but not found at serving (append-only); the next precompute run includes them.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("requested_at", "TIMESTAMP", "when the lookup missed, UTC"),
        ("origin", "STRING", "who recorded the miss: 'lookup' or 'replay'"),
        # Consumption is recorded in miss_consumption: a MERGE here by precompute conflicted with the
        # lookup's appends. Rows of lakes written before that keep the run they were marked with.
        ("consumed_by_run", "STRING", "NULL; in older rows, the precompute run that took the pair in"),
    ),
    primary_key=("user_id", "item_id", "requested_at"),
)

MISS_CONSUMPTION = TableSpec(
    name="miss_consumption",
    description="Which precompute run took in each queued miss; written by precompute alone, so the "
                "lookup's appends to miss_queue never conflict with it.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("item_id", "STRING", "source item id"),
        ("requested_at", "TIMESTAMP", "the miss_queue row's request time"),
        ("consumed_by_run", "STRING", "precompute run that took the pair in"),
    ),
    primary_key=("user_id", "item_id", "requested_at"),
)

PRECOMPUTE_RUNS = TableSpec(
    name="precompute_runs",
    description="Counters of every precompute run.",
    columns=(
        ("run_id", "STRING", "interval end, UTC"),
        ("interval_start", "TIMESTAMP", "start of the look-back window"),
        ("interval_end", "TIMESTAMP", "the run's time t"),
        ("pairs_considered", "BIGINT", "candidate pairs speculated plus queued"),
        ("pairs_scored", "BIGINT", "pairs scored by the verifier"),
        ("pairs_selected", "BIGINT", "pairs in the precompute set"),
        ("already_fresh", "BIGINT", "top pairs skipped because their embedding is fresh past t + margin"),
        ("pairs_embedded", "BIGINT", "embeddings written"),
        ("expired_removed", "BIGINT", "expired rows deleted by this run's cleanup"),
        ("queue_in", "BIGINT", "miss-queue pairs taken in"),
        ("queue_waiting", "BIGINT", "miss-queue pairs still waiting after the run"),
        ("queue_pruned", "BIGINT", "queued misses older than [precompute] queue_retention_hours deleted by this run"),
        ("vm_version", "STRING", "verifier model used"),
        ("fm_version", "STRING", "code space written: the fm and autoencoder the config names (model.registry.code_version)"),
        ("seconds", "DOUBLE", "wall time"),
        ("rollout_code_version", "STRING", "the consumers' code space written beside fm_version during a rollout (NULL: none)"),
    ),
    primary_key=("run_id",),
)

USER_EMBEDDING_SUMS = TableSpec(
    name="user_embedding_sums",
    description="Per precompute run and user: the sum and count of the pair embeddings the run wrote (partials of the user means).",
    columns=(
        ("run_id", "STRING", "precompute run that wrote the pair embeddings"),
        ("user_id", "STRING", "source user id"),
        ("embedding_sum", "ARRAY<DOUBLE>", "sum of the user's valid pair embeddings from the run (C values)"),
        ("pair_count", "BIGINT", "pairs summed"),
        ("computed_at", "TIMESTAMP", "the run's time t"),
        ("code_version", "STRING", "code space of the embeddings summed: a mean adds up partials of one code space only"),
    ),
    primary_key=("run_id", "user_id", "code_version"),
    partition_by=("run_id",),
    expiry="partials older than the user-mean window are deleted by the user-mean job",
)

USER_MEAN_EMBEDDINGS = TableSpec(
    name="user_mean_embeddings",
    description="Per user, the mean of the user's pair embeddings computed in the window before computed_at: the user_mean tier.",
    columns=(
        ("user_id", "STRING", "source user id"),
        ("embedding", "ARRAY<FLOAT>", "mean pair embedding (C floats)"),
        ("pair_count", "BIGINT", "pair embeddings averaged (a pair recomputed twice counts twice)"),
        ("window_start", "TIMESTAMP", "embeddings computed in [window_start, computed_at] were averaged"),
        ("computed_at", "TIMESTAMP", "the run's time t"),
        ("expires_at", "TIMESTAMP", "computed_at + user-mean TTL; never served at or after this time"),
        ("run_id", "STRING", "run that wrote it"),
        ("code_version", "STRING", "code space of the pair embeddings averaged (model.registry.code_version)"),
    ),
    primary_key=("user_id", "code_version"),
    expiry="a row is valid for t in [computed_at, expires_at)",
)

ITEM_EMBEDDING_SUMS = TableSpec(
    name="item_embedding_sums",
    description="Per precompute run and item: the sum and count of the pair embeddings the run wrote (partials of the item means).",
    columns=(
        ("run_id", "STRING", "precompute run that wrote the pair embeddings"),
        ("item_id", "STRING", "source item id"),
        ("embedding_sum", "ARRAY<DOUBLE>", "sum of the item's valid pair embeddings from the run, over its users (C values)"),
        ("pair_count", "BIGINT", "pairs summed"),
        ("computed_at", "TIMESTAMP", "the run's time t"),
        ("code_version", "STRING", "code space of the embeddings summed: a mean adds up partials of one code space only"),
    ),
    primary_key=("run_id", "item_id", "code_version"),
    partition_by=("run_id",),
    expiry="partials older than the item-mean window are deleted by the mean job",
)

ITEM_MEAN_EMBEDDINGS = TableSpec(
    name="item_mean_embeddings",
    description="Per item, the time-decayed mean of its pair embeddings across users computed in the window before computed_at: the item_mean tier.",
    columns=(
        ("item_id", "STRING", "source item id"),
        ("embedding", "ARRAY<FLOAT>", "decayed mean pair embedding (C floats): each run's pairs weigh 2^(-age / half-life)"),
        ("pair_count", "BIGINT", "pair embeddings averaged"),
        ("window_start", "TIMESTAMP", "embeddings computed in [window_start, computed_at] were averaged"),
        ("computed_at", "TIMESTAMP", "the run's time t"),
        ("expires_at", "TIMESTAMP", "computed_at + item-mean TTL; never served at or after this time"),
        ("run_id", "STRING", "run that wrote it"),
        ("code_version", "STRING", "code space of the pair embeddings averaged (model.registry.code_version)"),
    ),
    primary_key=("item_id", "code_version"),
    expiry="a row is valid for t in [computed_at, expires_at)",
)

USER_NEIGHBORS = TableSpec(
    name="user_neighbors",
    description="Per user, the top-k most similar users (cosine of FM user vectors) that have a user mean to lend.",
    columns=(
        ("user_id", "STRING", "the user who borrows"),
        ("rank", "INT", "1 = most similar"),
        ("neighbor_id", "STRING", "the user lent from"),
        ("similarity", "FLOAT", "cosine similarity of the FM user vectors"),
        ("index_kind", "STRING", "FAISS index that found it: IndexFlatIP (exact) or IndexHNSWFlat"),
        ("computed_at", "TIMESTAMP", "the build's time t"),
        ("expires_at", "TIMESTAMP", "computed_at + neighbor TTL; never served at or after this time"),
        ("run_id", "STRING", "build that wrote it"),
    ),
    primary_key=("user_id", "rank"),
    expiry="a row is valid for t in [computed_at, expires_at); a build MERGEs the users whose list changed "
           "(and renews rows past half their TTL), deletes the users no longer represented",
)

USER_VECTORS = TableSpec(
    name="user_vectors",
    description="The neighbor build's state: per represented user, the FM user vector of the last build, a key of "
                "its inputs, and its exact top lenders to some depth, so that the next build searches only what changed.",
    columns=(
        ("user_id", "STRING", "a user represented at the build"),
        ("inputs_key", "BIGINT", "52-bit digest of what the FM's user pass read (user, history items, categories, recency codes)"),
        ("vector", "ARRAY<FLOAT>", "the FM user vector (not normalised)"),
        ("lender", "BOOLEAN", "the user had a user mean at the build: indexed, may lend"),
        ("candidates", "ARRAY<STRING>", "the user's top lenders, most similar first (exact up to the depth)"),
        ("candidate_similarity", "ARRAY<FLOAT>", "their cosine similarities"),
        ("candidates_complete", "BOOLEAN", "candidates hold every lender but the user"),
        ("listed_at", "TIMESTAMP", "computed_at of the user's rows in user_neighbors"),
        ("model_version", "STRING", "FM version folder and weights digest the vector came from"),
        ("k", "INT", "neighbors_k of the build: user_neighbors holds each list's first k"),
        ("neighbors_version", "BIGINT", "Delta version of user_neighbors these lists describe; another one: rebuild all"),
        ("computed_at", "TIMESTAMP", "the build's time t"),
        ("run_id", "STRING", "build that wrote it"),
    ),
    primary_key=("user_id",),
    expiry="replaced by every build (a cache of it; never served)",
)

FEATURE_VERSIONS = TableSpec(
    name="feature_versions",
    description="Published snapshots: the Delta versions of the serving tables after each run; readers serve the latest.",
    columns=(
        ("run_id", "STRING", "the run whose tables these are"),
        ("interval_end", "TIMESTAMP", "the run's time t: this snapshot serves requests from t on"),
        ("pair_embeddings_version", "BIGINT", "Delta version of pair_embeddings"),
        ("user_mean_embeddings_version", "BIGINT", "Delta version of user_mean_embeddings"),
        ("user_neighbors_version", "BIGINT", "Delta version of user_neighbors"),
        ("item_mean_embeddings_version", "BIGINT", "Delta version of item_mean_embeddings (NULL: published before it existed)"),
        ("published_at", "TIMESTAMP", "wall-clock time of publication, UTC"),
        ("code_version", "STRING", "the code space this snapshot serves: only rows of it are read (NULL: published before versions)"),
        ("shadow_code_version", "STRING", "during a rollout, the new code space resolved in shadow beside it (NULL: none)"),
    ),
    primary_key=("run_id",),
)

REQUEST_FEATURES = TableSpec(
    name="request_features",
    description="Every logged candidate with the FM embedding and tier served at its request time: what VM training reads.",
    columns=(
        ("request_id", "STRING", "request"),
        ("item_id", "STRING", "candidate"),
        ("user_id", "STRING", "requesting user"),
        ("ts", "TIMESTAMP", "request time, UTC"),
        ("label", "INT", "click label from request_log"),
        ("tier", "STRING", "exact, item_mean, user_mean, neighbor or none"),
        ("embedding", "ARRAY<FLOAT>", "the embedding served (zeros for tier none)"),
        ("snapshot_run_id", "STRING", "published snapshot that served it; NULL if none was published yet"),
        ("date", "DATE", "partition: UTC date of ts"),
        ("code_version", "STRING", "code space of the snapshot that served it (NULL: none, or published before versions)"),
    ),
    primary_key=("request_id", "item_id"),
    partition_by=("date",),
)

SHADOW_REQUEST_FEATURES = TableSpec(
    name="shadow_request_features",
    description="During a rollout: every logged candidate with the embedding and tier the new code space would have "
                "served (not served): what the consumers of the new FM or autoencoder are trained on.",
    columns=REQUEST_FEATURES.columns,
    primary_key=("request_id", "item_id", "code_version"),
    partition_by=("date",),
)

COVERAGE_REPORT = TableSpec(
    name="coverage_report",
    description="Share of served candidates by tier for a replayed interval, overall and by user activity.",
    columns=(
        ("report_id", "STRING", "interval start..end"),
        ("interval_start", "TIMESTAMP", "requests from"),
        ("interval_end", "TIMESTAMP", "requests before"),
        ("activity", "STRING", "'all' or the user's requests in the interval: '1', '2-4', '5-19', '20+'"),
        ("tier", "STRING", "exact, user_mean, neighbor or none"),
        ("pairs", "BIGINT", "served candidates"),
        ("share", "DOUBLE", "pairs / all pairs in the activity bucket"),
    ),
    primary_key=("report_id", "activity", "tier"),
)

COVERAGE_SWEEP = TableSpec(
    name="coverage_sweep",
    description="Coverage by tier of one replay per precompute setting (budget, embedding TTL): experiments/coverage_sweep.py.",
    columns=(
        ("point", "STRING", "the setting, e.g. budget0.2_ttl6h"),
        ("budget", "DOUBLE", "share of scored pairs precomputed per run"),
        ("ttl_hours", "DOUBLE", "pair-embedding TTL"),
        ("replay_start", "TIMESTAMP", "first cycle's t"),
        ("interval_start", "TIMESTAMP", "measured requests from"),
        ("interval_end", "TIMESTAMP", "measured requests before (the last cycle's t)"),
        ("tier", "STRING", "exact, user_mean, neighbor or none"),
        ("pairs", "BIGINT", "served candidates in the measured interval"),
        ("share", "DOUBLE", "pairs / all served candidates in the measured interval"),
        ("fm_inferences", "BIGINT", "pair embeddings the FM computed over the whole replay"),
        ("pairs_scored", "BIGINT", "pairs the verifier scored over the whole replay"),
        ("cycles", "INT", "hourly cycles replayed"),
        ("seconds", "DOUBLE", "wall time of the replay"),
    ),
    primary_key=("point", "replay_start", "interval_start", "interval_end", "tier"),
)

ALL_TABLES: tuple[TableSpec, ...] = (REQUEST_LOG, USER_EVENTS, ITEMS, TRUTH, REQUEST_LOG_QUARANTINE, INGEST_RUNS,
                                     PAIR_EMBEDDINGS, VERIFIER_SCORES, MISS_QUEUE, MISS_CONSUMPTION, PRECOMPUTE_RUNS,
                                     USER_EMBEDDING_SUMS, USER_MEAN_EMBEDDINGS, ITEM_EMBEDDING_SUMS, ITEM_MEAN_EMBEDDINGS,
                                     USER_NEIGHBORS, USER_VECTORS, FEATURE_VERSIONS,
                                     REQUEST_FEATURES, SHADOW_REQUEST_FEATURES, COVERAGE_REPORT, COVERAGE_SWEEP)
BY_NAME = {t.name: t for t in ALL_TABLES}


def qualified_name(spec: TableSpec, database: str) -> str:
    return f"{database}.{spec.name}"


def ensure_table(spark, spec: TableSpec, cfg) -> str:
    """Create ``spec`` in the catalog as an external Delta table if it is not there; return its name.

    The table's location is fixed by the declaration and the lake root, so a catalog rebuilt from
    scratch finds the same data again.
    """
    name = qualified_name(spec, cfg.lake.database)
    location = cfg.lake.table_path(spec.name)
    partition = f" PARTITIONED BY ({', '.join(spec.partition_by)})" if spec.partition_by else ""
    comments = ", ".join(f"{n} {t} COMMENT '{c.replace(chr(39), '')}'" for n, t, c in spec.columns)
    from include.spark import create_if_absent  # here: this module of declarations imports nothing

    create_if_absent(spark, f"CREATE TABLE IF NOT EXISTS {name} ({comments}) USING DELTA{partition} "
                            f"LOCATION '{location}' COMMENT '{spec.description.replace(chr(39), '')}'",
                     lambda: spark.catalog.tableExists(name))
    # A table written by an older declaration gains the columns declared since (NULL in its old rows);
    # nothing is dropped or rewritten.
    have = set(spark.table(name).columns)
    added = [(n, t, c) for n, t, c in spec.columns if n not in have]
    if added:
        spark.sql(f"ALTER TABLE {name} ADD COLUMNS ("
                  + ", ".join(f"{n} {t} COMMENT '{c.replace(chr(39), '')}'" for n, t, c in added) + ")")
    return name


def ensure_tables(spark, cfg, specs: tuple[TableSpec, ...] = ALL_TABLES) -> None:
    for spec in specs:
        ensure_table(spark, spec, cfg)


def in_time_range(df, start, end, ts: str = "ts"):
    """Rows with ``start <= ts < end``, plus the same bound on the ``date`` partition column when the
    table has one: Spark cannot derive a partition filter from ``ts``, and without it every read of
    an hour scans the whole log."""
    from datetime import timedelta

    from pyspark.sql import functions as F

    cond = (F.col(ts) >= F.lit(start)) & (F.col(ts) < F.lit(end))
    if "date" in df.columns:
        cond = cond & (F.col("date") >= F.lit(start.date())) & (F.col("date") <= F.lit((end + timedelta(microseconds=-1)).date()))
    return df.where(cond)


def conform(df, spec: TableSpec):
    """Select and cast ``df``'s columns to exactly the declared schema, in declared order.

    A missing column is an error here, not a column of nulls in the table.
    """
    from pyspark.sql import functions as F

    missing = [n for n in spec.column_names if n not in df.columns]
    if missing:
        raise ValueError(f"{spec.name}: dataframe lacks declared column(s) {missing}; has {df.columns}")
    return df.select([F.col(n).cast(t).alias(n) for n, t, _ in spec.columns])
