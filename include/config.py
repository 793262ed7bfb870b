"""Typed configuration for SOLARIS.

Defaults run the embedded setup: local Spark, a Delta lake under ./lake, a Derby metastore
beside it. A TOML file (``--config`` or ``SOLARIS_CONFIG``) overrides any field; unknown keys
are rejected so a typo never silently falls back to a default. Only deployment values come
from the environment; ``ENVIRONMENT`` lists every variable the code reads.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration file or value that SOLARIS cannot use."""


# Every environment variable SOLARIS reads, and what it sets. Nothing else is read from the environment.
ENVIRONMENT = {
    "SOLARIS_CONFIG": "path of the TOML config file (when no --config is given)",
    "SOLARIS_LAKE_ROOT": "[lake] root: where the tables, the metastore and the models live",
    "SOLARIS_SPARK_MASTER": "[spark] master: local[*], spark://host:7077, yarn, k8s://...",
    "SOLARIS_SPARK_DRIVER_JAVA_OPTIONS": "[spark] driver_java_options: JVM flags for the Spark driver",
    "SOLARIS_SPARK_CONF": "[spark] extra: whitespace-separated key=value Spark properties, over the file's",
    "SOLARIS_REDIS_URL": "[redis] url; set, the DAGs publish each snapshot to Redis",
    "SOLARIS_SPARK_CONN_ID": "the Airflow connection the DAGs submit Spark jobs through (default solaris_spark)",
}


@dataclass(frozen=True)
class LakeConfig:
    root: str = "lake"  # relative paths resolve against the working directory
    database: str = "solaris"  # catalog database the tables are registered in

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser().resolve()

    @property
    def tables_path(self) -> Path:
        return self.root_path / "tables"

    @property
    def warehouse_path(self) -> Path:
        return self.root_path / "warehouse"

    @property
    def metastore_path(self) -> Path:
        return self.root_path / "metastore_db"

    @property
    def quality_path(self) -> Path:
        return self.root_path / "quality"

    def table_path(self, name: str) -> Path:
        return self.tables_path / name


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"  # a spark:// URL or yarn/k8s master points the same code at a cluster
    app_name: str = "solaris"
    shuffle_partitions: int = 8  # small lake by default; raise on a cluster
    driver_memory: str = "4g"
    ui_enabled: bool = False
    # JVM flags for the driver (e.g. "-XX:+UseG1GC -Xss4m"), added to the ones SOLARIS sets itself
    # (the metastore's home, logging), which "spark.driver.extraJavaOptions" in `extra` would replace.
    driver_java_options: str = ""
    # Map the driver's class-data sharing archive (include/class_data.py, built by `make install`):
    # a driver JVM starts in about 0.6 of the time. Without an archive for this machine: no effect.
    class_data_sharing: bool = True
    # Extra Spark settings passed through untouched (e.g. {"spark.executor.memory": "8g"}).
    extra: dict[str, str] = field(default_factory=dict)
    # GPU dispatch of the FM embedding stage, on a cluster master (spark://, yarn, k8s://): every
    # executor holds executor_gpus GPUs, found by gpu_discovery_script (default: include/gpu_discovery.sh,
    # nvidia-smi); each embedding task asks Spark for task_gpus of one (a fraction shares a GPU) and runs
    # on the address Spark assigned it, on the CPU where torch sees no GPU. Every other stage asks for
    # none. 0: off (the stage runs on [models] device, decided on the driver).
    executor_gpus: int = 0
    task_gpus: float = 1.0
    gpu_discovery_script: str = ""

    def __post_init__(self):
        if self.executor_gpus < 0:
            raise ConfigError(f"[spark] executor_gpus must be >= 0, got {self.executor_gpus}")
        if not (0 < self.task_gpus <= 1 or float(self.task_gpus).is_integer()) or self.task_gpus > max(1, self.executor_gpus):
            raise ConfigError(f"[spark] task_gpus must be a fraction of one GPU or a whole number at most "
                              f"executor_gpus, got {self.task_gpus}")
        if self.executor_gpus and self.master.startswith("local"):
            raise ConfigError("[spark] executor_gpus needs a cluster master (spark://, yarn, k8s://): Spark assigns "
                              "GPUs to tasks only there; on one machine [models] device = \"cuda\" runs the FM on its GPU")


@dataclass(frozen=True)
class ClickLogConfig:
    """How a click-only log becomes requests with candidate lists (see spark_jobs/candidates.py)."""

    negatives_per_click: int = 9  # K: candidates shown beside the clicked item
    # Negatives are drawn from the clicks that follow the click, in its hour and the next one,
    # widened to later hours until the pool holds min_pool_clicks events, at most max_window_hours
    # after the click's hour (spark_jobs/candidates.py has why, and the measurements).
    min_pool_clicks: int = 1
    max_window_hours: int = 24
    # "after": the pools above. "before": the clicks of the whole hour before the click's hour, this
    # generator's first form, which gives the label away on sparse logs: kept to reproduce that
    # (the ingest's leak check flags it and training refuses it).
    pool: str = "after"
    # New items (no click before the request) take as large a share of the negatives as first
    # clicks take of the hour's clicks: a news log's clicks that follow a request hold many items
    # published after it, which then are almost never the click (Globo: CTR 0.016-0.050 on the rows
    # with no item-level code), while on a sparse log nearly every click is an item's first.
    # false draws from the pool as it is, to reproduce that.
    match_new_items: bool = True
    pool_size: int = 1000  # negatives are drawn from a seeded sample of this many click events of the window
    seed: int = 7

    def __post_init__(self):
        if self.negatives_per_click < 0:
            raise ConfigError("[clicklog] negatives_per_click must be >= 0")
        if self.min_pool_clicks < 1 or self.max_window_hours < 1:
            raise ConfigError("[clicklog] min_pool_clicks and max_window_hours must be >= 1")
        if self.pool not in ("after", "before"):
            raise ConfigError(f"[clicklog] pool must be 'after' or 'before', got {self.pool!r}")
        if self.pool_size < self.negatives_per_click:
            raise ConfigError("[clicklog] pool_size must be >= negatives_per_click")


@dataclass(frozen=True)
class QualityConfig:
    """Data-quality bounds checked with great-expectations on every ingested slice."""

    min_ts: str = "1970-01-01T00:00:00"  # UTC; rows outside [min_ts, max_ts) are quarantined
    max_ts: str = "2100-01-01T00:00:00"
    max_candidates_per_request: int = 500
    min_coverage: float = 0.0  # feature check: share of the past hour's candidates served a non-zero tier
    # Generated candidates (click logs): a single-feature AUC outside [leak_auc_min, leak_auc_max]
    # means the generator, not the users, separates the labels. Training, model_eval, the replay
    # and the daily DAG refuse such a source unless allow_leaking_candidates (then every figure
    # is marked and no transfer ratio is printed).
    leak_auc_min: float = 0.40
    leak_auc_max: float = 0.65
    allow_leaking_candidates: bool = False

    def __post_init__(self):
        from datetime import datetime

        try:
            lo, hi = datetime.fromisoformat(self.min_ts), datetime.fromisoformat(self.max_ts)
        except ValueError as e:
            raise ConfigError(f"[quality] min_ts and max_ts must be ISO timestamps: {e}") from None
        if lo >= hi:
            raise ConfigError(f"[quality] min_ts ({self.min_ts}) must be before max_ts ({self.max_ts})")
        if not 0 <= self.leak_auc_min < 0.5 < self.leak_auc_max <= 1:
            raise ConfigError("[quality] leak_auc_min must be in [0, 0.5) and leak_auc_max in (0.5, 1]")

    def leaks(self, stats: dict) -> list[str]:
        """The leak-check statistics of ``stats`` (LEAK_STATISTICS names -> AUC) outside the band, as
        "prior popularity AUC 0.017"; NaN (one class only, nothing to judge) and None are skipped."""
        return [f"{label} AUC {stats[key]:.3f}" for key, label in LEAK_STATISTICS
                if stats.get(key) is not None and stats[key] == stats[key]
                and not self.leak_auc_min <= stats[key] <= self.leak_auc_max]

    @staticmethod
    def leak_advice(findings: list[str]) -> str:
        """What to try about ``findings`` (``leaks``' lines, maybe after "INPUT: "). Where only the
        user's side leaks, the default pool is what gives it away (its negatives are clicks of
        anybody, while a user's click continues what the user browses): re-ingesting cannot help."""
        user_side = tuple(f"{label} AUC" for key, label in LEAK_STATISTICS if key in USER_SIDE_LEAKS)
        if findings and all(any(mark in f for mark in user_side) for f in findings):
            return ("its negatives are not what a ranker would show this user (spark_jobs/candidates.py); "
                    "ingest a log of what was shown (--data impressions) if there is one")
        return "re-ingest it with the default [clicklog] pool (spark_jobs/candidates.py)"


# The leak check's single-feature AUCs of generated candidates (spark_jobs/candidates.py), as
# stored in ingest_runs, and how reports name them: the item's side, the position, the user's side.
LEAK_STATISTICS = (("popularity_auc", "prior popularity"), ("recent_click_auc", "recent click"),
                   ("known_item_auc", "known item"), ("position_auc", "position"),
                   ("same_category_auc", "same category as the last click"),
                   ("category_share_auc", "share of recent clicks in the category"),
                   ("interacted_before_auc", "clicked by the user before"))
USER_SIDE_LEAKS = ("same_category_auc", "category_share_auc", "interacted_before_auc")  # what the user's history shows


@dataclass(frozen=True)
class PrecomputeConfig:
    """The speculative precompute run for an interval ending at t (spark_jobs/precompute.py)."""

    lookback_hours: int = 6  # W: users active and items shown in [t - W, t) are speculated
    recent_items_per_user: int = 20  # a user's most recently shown items that become candidates
    trending_items: int = 20  # items most clicked in W, added to every active user's candidates
    budget: float = 0.2  # share of scored pairs to precompute
    selection: str = "global"  # "global": top budget share of all pairs; "per_user": of each user's
    ttl_hours: float = 6.0  # expires_at = computed_at + TTL
    fresh_margin_minutes: int = 60  # a stored embedding fresh past t + margin is not recomputed
    vacuum_retention_hours: int = 168  # Delta VACUUM keeps files this long: as-of resolution time-travels
    vacuum_every_hours: int = 24  # VACUUM at interval ends that are a multiple of this many UTC hours; 0 never
    # Queued misses are taken beside the budget, but bounded: a run takes at most this many of one
    # user (the most recently requested) and this many in all; the rest wait for later runs.
    queue_per_user: int = 50
    queue_max_pairs: int = 20_000
    # Each run deletes queued misses requested longer ago than this, taken in or not (a miss this
    # old is stale: its pair would be speculated again if it were still asked for), and their
    # consumption rows: the queue stays as large as its last day of traffic.
    queue_retention_hours: float = 24.0

    def __post_init__(self):
        if self.queue_per_user < 0 or self.queue_max_pairs < 0:
            raise ConfigError("[precompute] queue_per_user and queue_max_pairs must be >= 0")
        if self.queue_retention_hours <= 0:
            raise ConfigError("[precompute] queue_retention_hours must be > 0")
        if not 0 < self.budget <= 1:
            raise ConfigError(f"[precompute] budget must be in (0, 1], got {self.budget}")
        if self.selection not in ("global", "per_user"):
            raise ConfigError(f"[precompute] selection must be 'global' or 'per_user', got {self.selection!r}")
        if self.lookback_hours <= 0:
            raise ConfigError("[precompute] lookback_hours must be > 0")


TASKS = ("click", "conversion")  # the labels a consumer VM can learn: request_log's label and conversion


@dataclass(frozen=True)
class ConsumerConfig:
    """One VM that reads the served embeddings (``[[models.consumers]]``): trained, evaluated and
    promoted on its own, as ``vm_<name>`` in the registry (with ``vm_<name>_kd``, ``vm_<name>_oracle``
    and ``vm_<name>_solaris``, trained on what was served, beside it)."""

    name: str
    task: str = "click"  # its label: click (request_log.label) or conversion (request_log.conversion)
    surface: str = ""  # only requests from this surface; "" all
    class_path: str = ""  # the VM class (model.interface); "" the [models] vm_class
    params: dict[str, Any] = field(default_factory=dict)  # its config fields beyond SOLARIS's sizes
    # the ids and context it reads (model.vm.FEATURES: user, item, hour, device, surface); [] all.
    # Goes to its class's ``features`` config field: the built-in VM has one.
    features: tuple[str, ...] = ()

    def __post_init__(self):
        import re

        if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", self.name or ""):
            raise ConfigError(f"[[models.consumers]] name must be lower-case letters, digits and _, "
                              f"starting with a letter; got {self.name!r}")
        if self.task not in TASKS:
            raise ConfigError(f"[[models.consumers]] {self.name}: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not isinstance(self.params, dict):
            raise ConfigError(f"[[models.consumers]] {self.name}: params must be a table")
        if not isinstance(self.features, (list, tuple)) or not all(isinstance(f, str) for f in self.features):
            raise ConfigError(f"[[models.consumers]] {self.name}: features must be a list of names")
        object.__setattr__(self, "features", tuple(self.features))


@dataclass(frozen=True)
class ModelsConfig:
    """The model set: where the registry is, which versions the jobs run, how big training makes them."""

    root: str = ""  # the registry; default: <lake root>/models
    sizes: str = "quick"  # what training builds: "quick" (small, CPU minutes) or "full" (model/training.py)
    vm_version: str = "latest"  # verifier: a registry version (v0003), "latest" or "promoted"
    fm_version: str = "latest"
    ae_version: str = "latest"
    device: str = "auto"  # training and FM inference: auto (CUDA when present), cpu, cuda
    # Bring your own models (model/interface.py): classes by import path, and their config fields
    # beyond what SOLARIS fills in. Only the classes named here (and the built-ins) ever load.
    fm_class: str = "model.fm.FoundationModel"
    fm_params: dict[str, Any] = field(default_factory=dict)
    vm_class: str = "model.vm.VerticalModel"
    vm_params: dict[str, Any] = field(default_factory=dict)  # for the consumers without a class_path of their own
    # The VMs that read the embeddings; the daily DAG trains and gates every one.
    consumers: tuple[ConsumerConfig, ...] = (ConsumerConfig("click"),)
    verifier: str = "click"  # the consumer whose plain VM scores the candidates precompute chooses from
    # The daily DAG trains each consumer's VM + SOLARIS on the features the lookup served
    # (request_features) of this many hours before the newest served one (model/served_training.py);
    # with fewer rows than served_min_rows of a consumer there, its plain VM keeps serving it.
    served_window_hours: float = 48.0
    served_min_rows: int = 5000
    # A new FM or autoencoder is rolled out in shadow (model/registry.py CodeSpaces): precompute writes
    # the consumers' code space beside the new one for at most this many hours after the new one's
    # first run, while the consumers are retrained on it; past that only the new one is written.
    rollout_overlap_hours: float = 72.0
    # false: serve the code space of the models named here whatever the consumers read (a replay
    # pins one model set and serves it)
    rollout: bool = True

    def __post_init__(self):
        if not self.consumers:
            raise ConfigError("[models] consumers: at least one VM must read the embeddings")
        names = [c.name for c in self.consumers]
        if len(set(names)) != len(names):
            raise ConfigError(f"[[models.consumers]] names must be unique, got {names}")
        if self.verifier not in names:
            raise ConfigError(f"[models] verifier must name a consumer ({', '.join(names)}), got {self.verifier!r}")
        for key in ("fm_params", "vm_params"):
            if not isinstance(getattr(self, key), dict):
                raise ConfigError(f"[models] {key} must be a table")
        if not self.served_window_hours > 0:
            raise ConfigError(f"[models] served_window_hours must be > 0, got {self.served_window_hours!r}")
        if not isinstance(self.served_min_rows, int) or self.served_min_rows < 1:
            raise ConfigError(f"[models] served_min_rows must be a positive integer, got {self.served_min_rows!r}")
        if not self.rollout_overlap_hours >= 0:
            raise ConfigError(f"[models] rollout_overlap_hours must be >= 0, got {self.rollout_overlap_hours!r}")
        if self.sizes not in MODEL_SIZES:
            raise ConfigError(f"[models] sizes must be one of {', '.join(MODEL_SIZES)}, got {self.sizes!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"[models] device must be auto, cpu or cuda[:N], got {self.device!r}")


MODEL_SIZES = ("quick", "full", "tiny")  # the one spelling of model sizes, in config and on every command line


@dataclass(frozen=True)
class ServeConfig:
    """The online lookup service (lookup/serve.py)."""

    host: str = "127.0.0.1"  # loopback by default: expose it deliberately
    port: int = 8765
    backend: str = "embedded"  # "embedded" (snapshot of the lake in process) or "redis" ([redis] url)
    poll_seconds: float = 5.0  # how often the embedded store looks for a new publication
    max_items: int = 1000  # candidates per request
    max_body_bytes: int = 1 << 20
    record_misses: bool = True  # append misses to miss_queue, for the next precompute run
    miss_flush_seconds: float = 2.0  # how often buffered misses are appended (and at shutdown)
    # pairs one user may queue per flush interval (a repeated pair counts once): one client cannot
    # flood the queue; precompute then prefers misses of users with traffic in its window
    miss_per_user: int = 200
    # embedding size answered before any snapshot loads; 0: the registry's autoencoder code size
    dim: int = 0
    # A request may say which time to resolve at (``now``) only where the operator allows it, for
    # replays: otherwise a client could back-date requests to make expired or future rows count.
    allow_client_now: bool = False
    # the HTTP server (uvicorn): how long a request may take to arrive whole, how long an idle
    # kept-alive connection stays open, how many connections at once (503 beyond), the listen backlog
    request_timeout_seconds: float = 10.0
    keepalive_seconds: int = 5
    max_connections: int = 1000  # per worker
    backlog: int = 2048
    # server processes sharing the port, each with its own snapshot in memory: one Python process
    # tops out near one core (benchmarks/RESULTS.md); more workers cost one snapshot's memory each
    workers: int = 1

    def __post_init__(self):
        if self.request_timeout_seconds <= 0 or self.keepalive_seconds < 0 or self.max_connections < 1 or self.backlog < 1:
            raise ConfigError("[serve] request_timeout_seconds must be > 0, keepalive_seconds >= 0, "
                              "max_connections and backlog >= 1")
        if not 1 <= self.workers <= 64:
            raise ConfigError(f"[serve] workers must be in [1, 64], got {self.workers}")
        if self.dim < 0:
            raise ConfigError(f"[serve] dim must be >= 0, got {self.dim}")
        if self.miss_per_user < 1:
            raise ConfigError(f"[serve] miss_per_user must be >= 1, got {self.miss_per_user}")
        if self.backend not in ("embedded", "redis"):
            raise ConfigError(f"[serve] backend must be 'embedded' or 'redis', got {self.backend!r}")


@dataclass(frozen=True)
class RedisConfig:
    """Redis as the shared online backend (lookup/redis_store.py)."""

    url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "solaris"  # namespaces are <prefix>:<run_id>, the pointer <prefix>:current
    publish: bool = False  # the DAGs copy each published snapshot to Redis (SOLARIS_REDIS_URL turns it on)


@dataclass(frozen=True)
class FallbackConfig:
    """User and item means, neighbor tables and their resolution (spark_jobs/user_means.py, user_neighbors.py)."""

    user_mean_window_hours: int = 24  # the mean covers pair embeddings computed in [t - window, t]
    user_mean_ttl_hours: float = 6.0
    item_mean_window_hours: int = 24  # the item tier: pair embeddings of the item computed in [t - window, t]
    item_mean_half_life_hours: float = 6.0  # ... weighted 2^(-age / half-life): the item as it is now
    item_mean_ttl_hours: float = 6.0
    representation_window_hours: int = 168  # users active in [t - window, t) get neighbors
    neighbors_k: int = 10
    neighbor_ttl_hours: float = 24.0
    exact_search_max: int = 50_000  # FAISS: exact search up to this many lenders, HNSW above
    hnsw_m: int = 32  # HNSW graph degree
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 128  # search breadth: recall against speed
    recall_sample: int = 1_000  # queries checked against exact search for the reported recall@k


@dataclass(frozen=True)
class OrchestrationConfig:
    """How Airflow runs the DAGs' tasks (include/orchestration.py): every stage is idempotent for
    its interval, so a failed or killed task is retried whole."""

    retries: int = 2
    retry_delay_seconds: float = 120.0
    execution_timeout_hours: float = 2.0
    # Where the tasks that run the FM (precompute, backfill) go, with [spark] executor_gpus: an
    # Airflow pool sized to the jobs the cluster's GPUs hold at once, and the executor queue of the
    # workers that may submit them (Celery or Kubernetes executors). Empty: the default ones.
    gpu_pool: str = ""
    gpu_queue: str = ""

    def __post_init__(self):
        if self.retries < 0 or self.retry_delay_seconds < 0 or self.execution_timeout_hours <= 0:
            raise ConfigError("[orchestration] retries and retry_delay_seconds must be >= 0, "
                              "execution_timeout_hours > 0")


@dataclass(frozen=True)
class SolarisConfig:
    lake: LakeConfig = field(default_factory=LakeConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    clicklog: ClickLogConfig = field(default_factory=ClickLogConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    orchestration: OrchestrationConfig = field(default_factory=OrchestrationConfig)

    @property
    def allowed_classes(self) -> frozenset[str]:
        """The model classes the registry may load: the built-ins and those the config names."""
        named = {self.models.fm_class, self.models.vm_class, *(c.class_path for c in self.models.consumers if c.class_path)}
        return frozenset({ModelsConfig.fm_class, ModelsConfig.vm_class} | named)  # the defaults are the built-ins

    @property
    def models_root(self) -> Path:
        return Path(self.models.root).expanduser().resolve() if self.models.root else self.lake.root_path / "models"

    def with_overrides(self, **sections: dict[str, Any]) -> "SolarisConfig":
        """A copy with some fields replaced, e.g. ``cfg.with_overrides(lake={"root": "/tmp/x"})``."""
        return _build(SolarisConfig, _merge(dataclasses.asdict(self), sections), "")


def load_config(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> SolarisConfig:
    """Defaults, then the TOML file (argument or ``SOLARIS_CONFIG``), then deployment env vars."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    path = path or env.get("SOLARIS_CONFIG")
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
    if env.get("SOLARIS_LAKE_ROOT"):
        data = _merge(data, {"lake": {"root": env["SOLARIS_LAKE_ROOT"]}})
    if env.get("SOLARIS_SPARK_MASTER"):
        data = _merge(data, {"spark": {"master": env["SOLARIS_SPARK_MASTER"]}})
    if env.get("SOLARIS_SPARK_DRIVER_JAVA_OPTIONS"):
        data = _merge(data, {"spark": {"driver_java_options": env["SOLARIS_SPARK_DRIVER_JAVA_OPTIONS"]}})
    if env.get("SOLARIS_SPARK_CONF"):
        spark = data.get("spark") if isinstance(data.get("spark"), dict) else {}
        extra = spark.get("extra") if isinstance(spark.get("extra"), dict) else {}
        data = _merge(data, {"spark": {"extra": {**extra, **spark_properties(env["SOLARIS_SPARK_CONF"])}}})
    if env.get("SOLARIS_REDIS_URL"):
        data = _merge(data, {"redis": {"url": env["SOLARIS_REDIS_URL"], "publish": True}})
    return _build(SolarisConfig, data, "")


def spark_properties(text: str) -> dict[str, str]:
    """``SOLARIS_SPARK_CONF``'s value, ``key=value`` pairs separated by whitespace (as many
    ``spark-submit --conf`` would give), as a dict; a pair that is not ``spark.<name>=<value>`` is refused."""
    out = {}
    for pair in text.split():
        key, eq, value = pair.partition("=")
        if not (eq and key.startswith("spark.") and value):
            raise ConfigError(f"SOLARIS_SPARK_CONF: {pair!r} is not spark.<name>=<value>")
        out[key] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "extra":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _build(cls: type, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"[{where or 'root'}] must be a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key(s) in [{where or 'root'}]: {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        key = f"{where}.{name}" if where else name
        section = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if section is not None and dataclasses.is_dataclass(section):
            kwargs[name] = _build(section, value, key)
        elif name in _TABLE_LISTS.get(cls.__name__, {}):  # an array of tables: [[section.name]]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"config key {key} must be an array of tables ([[{key}]])")
            item = _TABLE_LISTS[cls.__name__][name]
            kwargs[name] = tuple(v if isinstance(v, item) else _build(item, v, key) for v in value)
        else:
            kwargs[name] = _check_type(f, value, key)
    return cls(**kwargs)


# Fields that hold an array of tables, per config class: field -> the class of one table.
_TABLE_LISTS = {"ModelsConfig": {"consumers": ConsumerConfig}}


def _check_type(f: dataclasses.Field, value: Any, key: str) -> Any:
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool,
                "dict[str, str]": dict, "dict[str, Any]": dict}.get(str(f.type))
    if expected is None:
        return value
    # bool is an int in Python; reject it where an int is meant so `true` is not read as 1.
    if isinstance(value, bool) and expected is not bool:
        raise ConfigError(f"config key {key} must be {f.type}, got a boolean")
    if not isinstance(value, expected):
        raise ConfigError(f"config key {key} must be {f.type}, got {type(value).__name__} {value!r}")
    return value
