"""The one SparkSession factory: Delta Lake extension and catalog, a persistent metastore, UTC.

Every job, test and the SQL entry point get their session here, so a table written by one is
addressable by name (``solaris.request_log``) from the others and from ``spark-sql``.

The embedded default keeps a Derby metastore under the lake root. Derby admits one JVM at a
time: run the SQL entry point after a job, not during it. A cluster deployment points
``spark.extra`` at a shared Hive metastore instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from include import class_data
from include.config import SolarisConfig
from include.spark_jars import delta_jars, remember_jars

LOG4J = Path(__file__).with_name("log4j2.properties")
GPU_DISCOVERY = Path(__file__).with_name("gpu_discovery.sh")  # Spark's resource discovery: nvidia-smi's GPUs


def spark_conf(cfg: SolarisConfig) -> dict[str, str]:
    """Every setting the session needs, as plain key/values (also fed to ``spark-sql --conf``)."""
    lake = cfg.lake
    lake.root_path.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.app.name": cfg.spark.app_name,
        "spark.master": cfg.spark.master,
        **delta_jars(),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(lake.warehouse_path),
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={lake.metastore_path};create=true",
        # Derby writes derby.log into the working directory unless told otherwise.
        "spark.driver.extraJavaOptions": " ".join(filter(None, [
            f"-Dderby.system.home={lake.root_path} -Dlog4j2.configurationFile=file:{LOG4J}",
            class_data.java_options() if cfg.spark.class_data_sharing else "", cfg.spark.driver_java_options])),
        # Event times are UTC everywhere: parsing, partition dates and display.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(cfg.spark.shuffle_partitions),
        "spark.driver.memory": cfg.spark.driver_memory,
        "spark.ui.enabled": str(cfg.spark.ui_enabled).lower(),
        # Python workers must run this interpreter, which has torch, faiss and the project.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Spark's warnings (cached-data notes, truncated plan strings, checkpoint lineage) are for
        # whoever debugs Spark; a job's reader sees the job's own lines and Spark's errors. From the
        # context's start on; log4j2.properties keeps what the JVM logs before it at warnings.
        "spark.log.level": "WARN" if verbose() else "ERROR",
        # Delta rebuilds table state with this many tasks; its default (50) dominates small local jobs.
        "spark.databricks.delta.snapshotPartitions": str(cfg.spark.shuffle_partitions),
        # Delta answers unfiltered min/max/count from its statistics, and that shortcut fails with a
        # ClassCastException (LocalDate vs java.sql.Date) under spark-sql, which turns on Java 8
        # time types: `SELECT max(date) FROM solaris.request_features` broke there.
        "spark.databricks.delta.optimizeMetadataQuery.enabled": "false",
        # Spark writes a CRC per Parquet page but does not check it on read unless told: a flipped
        # byte inside a page would be read as data. Every Spark reader fails on it instead, as the
        # lake's delta-rs reads do (feature_store/lake.read_arrow).
        "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
    }
    if cfg.spark.executor_gpus:
        # Executors hold GPUs; tasks ask for none unless their stage's profile does (embed_pairs).
        conf["spark.executor.resource.gpu.amount"] = str(cfg.spark.executor_gpus)
        conf["spark.executor.resource.gpu.discoveryScript"] = cfg.spark.gpu_discovery_script or str(GPU_DISCOVERY)
    if cfg.spark.master.startswith("local"):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf.update(cfg.spark.extra)
    return conf


def verbose() -> bool:
    """``--verbose`` (or SOLARIS_VERBOSE=1): Spark's warnings are shown, not only its errors."""
    return os.environ.get("SOLARIS_VERBOSE", "") not in ("", "0")


class MetastoreInUse(SystemExit):
    """Another Spark driver holds the lake's embedded (Derby) metastore. Derby admits one JVM at a
    time: without this check the second driver fails after minutes of retries and thousands of
    log lines. It ends the process with one line (it is a SystemExit), before any work."""


def metastore_locked(metastore_path: Path) -> bool:
    """Whether a process holds the embedded (Derby) metastore at ``metastore_path``: Derby holds an
    exclusive POSIX lock on ``dbex.lck`` while booted; probing takes and releases that lock."""
    import fcntl

    lock = metastore_path / "dbex.lck"
    if not lock.exists():
        return False
    with open(lock, "r+b") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.lockf(f, fcntl.LOCK_UN)
    return False


_DRIVER_LOCKS: dict[str, object] = {}  # open lock files, held until Derby holds its own


def _hold_driver_lock(metastore_path: Path) -> bool:
    """Take (non-blocking) an exclusive lock beside the embedded metastore, held while this
    process boots its driver (``_release_driver_lock`` once Derby holds its own); False when
    another process holds it."""
    import fcntl

    key = str(metastore_path)
    if key in _DRIVER_LOCKS:
        return True
    metastore_path.parent.mkdir(parents=True, exist_ok=True)
    f = open(metastore_path.parent / f".{metastore_path.name}.driver.lock", "a+b")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _DRIVER_LOCKS[key] = f
    return True


def _release_driver_lock(metastore_path: Path) -> None:
    f = _DRIVER_LOCKS.pop(str(metastore_path), None)
    if f is not None:
        f.close()


def check_metastore_free(cfg: SolarisConfig) -> None:
    """Raise ``MetastoreInUse`` if another process holds the embedded metastore; a shared metastore
    is not checked."""
    from pyspark import SparkContext

    if any(k in cfg.spark.extra for k in SHARED_METASTORE_KEYS):
        return
    if SparkContext._gateway is not None:
        # This process runs a JVM already, which may hold the lock itself; POSIX locks belong to
        # the process, so probing (and closing the file) here would release that JVM's lock.
        return
    # Two drivers started in the same second both saw Derby's lock free (Derby takes it only once
    # its JVM has booted, seconds later) and the second died after minutes of retries. A lock of
    # our own, taken now and held until Derby holds its lock (get_spark releases it), closes that window.
    if not _hold_driver_lock(cfg.lake.metastore_path) or metastore_locked(cfg.lake.metastore_path):
        raise MetastoreInUse(
            f"error: the lake's embedded metastore ({cfg.lake.metastore_path}) is in use by another Spark "
            f"driver (a job, spark-sql or the SQL entry point): the embedded default runs one at a time. "
            f"Wait for it, or point [spark] extra at a shared Hive metastore to run jobs side by side.")


def get_spark(cfg: SolarisConfig):
    """Get or create the session for ``cfg``; one per process, as Spark allows."""
    # Spark hands timestamps to Python in the process's local zone; SOLARIS runs in UTC throughout.
    if os.environ.get("TZ") != "UTC":
        os.environ["TZ"] = "UTC"
        time.tzset()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if cfg.spark.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:  # static settings apply only when the JVM starts; a live session is reused
        check_metastore_free(cfg)
        builder = SparkSession.builder
        for key, value in spark_conf(cfg).items():
            builder = builder.config(key, value)
        spark = builder.enableHiveSupport().getOrCreate()
        remember_jars(spark)
    ensure_database(spark, cfg)  # boots the metastore: Derby holds its own lock from here on
    _release_driver_lock(cfg.lake.metastore_path)
    return spark


def ensure_database(spark, cfg: SolarisConfig) -> None:
    """The config's catalog database, its warehouse folder under the lake root; a catalog that came
    with a copied or moved lake is pointed at this lake's tables (``relocate_tables``)."""
    db, want = cfg.lake.database, cfg.lake.warehouse_path / f"{cfg.lake.database}.db"
    create_if_absent(spark, f"CREATE DATABASE IF NOT EXISTS {db} LOCATION '{want}'",
                     lambda: spark.catalog.databaseExists(db))
    rows = {r[0]: r[1] for r in spark.sql(f"DESCRIBE DATABASE {db}").collect()}
    have = local_path(rows.get("Location", ""))
    if have != want and have.parent.name == "warehouse":
        relocate_tables(spark, cfg, old_root=have.parent.parent)


# What a metastore says when another driver registered the same object between this driver's
# check and its create. Spark registers a data source table through a temporary location named
# ``<table>-__PLACEHOLDER__`` under the database's folder, the same for every driver, and deletes it
# once its create returns: a driver whose create is under way then fails on the vanished folder.
LOST_CREATE_RACE = ("AlreadyExistsException", "DELTA_TABLE_ALREADY_EXISTS", "-__PLACEHOLDER__")


def create_if_absent(spark, statement: str, exists) -> None:
    """Run a ``CREATE ... IF NOT EXISTS``. On a metastore shared by several drivers, two of them
    can both find the object missing and both create it; the loser's create fails with one of
    ``LOST_CREATE_RACE``. That means the other driver won, not a failure, once the object exists;
    if it does not (the winner's create failed after all), the statement is tried once more."""
    try:
        spark.sql(statement)
    except Exception as e:  # pyspark's AnalysisException wrapping the metastore's HiveException
        if not any(m in str(e) for m in LOST_CREATE_RACE):
            raise
        if not exists():
            spark.sql(statement)


def local_path(uri: str) -> Path:
    """A catalog location (``file:/x``, ``file:///x`` or a bare path) as a local path."""
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else Path(uri)


class CatalogLocationError(RuntimeError):
    """The catalog's database belongs to another lake, and re-pointing it is not this lake's to do."""


# Settings that point Spark at a metastore shared beyond this lake (a cluster's Hive metastore).
SHARED_METASTORE_KEYS = ("spark.hadoop.javax.jdo.option.ConnectionURL", "spark.hadoop.hive.metastore.uris")


def relocate_tables(spark, cfg: SolarisConfig, old_root: Path) -> list[str]:
    """Point the entries of tables that lie outside this lake's root at this lake's folder of the
    table (or the same relative place under this root as under ``old_root``), where the data exists.

    The embedded metastore travels inside the lake folder and records absolute paths: after
    ``cp -r lake lake2`` (or a move) every name in lake2's catalog still points into ``lake``, so a
    read by name would read the original and a MERGE would write into it. Only the catalog entry
    changes (``ALTER TABLE ... SET LOCATION``; the tables are external Delta tables); no file is
    touched at either place. Entries whose data is not in this lake are left as they are and named.
    (The database's own location stays stale: Spark's built-in Hive 2.3 client cannot alter it.)
    With a shared metastore (``SHARED_METASTORE_KEYS`` in ``[spark.extra]``) the database may be
    another lake's in earnest: ``CatalogLocationError`` instead of any change.
    """
    root, db = cfg.lake.root_path, cfg.lake.database
    shared = [k for k in SHARED_METASTORE_KEYS if k in cfg.spark.extra]
    if shared:
        raise CatalogLocationError(
            f"the catalog database {db} lies in {old_root}, not in this lake ({root}), and the metastore is "
            f"shared beyond this lake ({', '.join(shared)}): give this lake its own [lake] database")
    moved, missing = [], []
    for row in spark.sql(f"SHOW TABLES IN {db}").collect():
        name = f"{db}.{row.tableName}"
        info = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()}
        at = local_path(info.get("Location") or "")
        if at.is_relative_to(root):
            continue
        # This lake's own folder of the table, whatever chain of copies the entry came through (in a
        # copy of a copy the entry points into the first copy, not under the database's old root);
        # else the same relative place under this root as under the old one.
        target = cfg.lake.table_path(row.tableName)
        if not (target / "_delta_log").is_dir() and at.is_relative_to(old_root):
            target = root / at.relative_to(old_root)
        if not (target / "_delta_log").is_dir():
            missing.append(f"{name} ({at})")
            continue
        spark.sql(f"ALTER TABLE {name} SET LOCATION '{target}'")
        moved.append(name)
    if moved or missing:
        print(f"note: the catalog of {root} pointed into {old_root} (a copied or moved lake): "
              f"{len(moved)} table(s) now read and write {root}"
              + (f"; not found here, left as they were: {', '.join(missing)}" if missing else ""), file=sys.stderr)
    return moved


def write_properties(cfg: SolarisConfig, path: Path | None = None) -> Path:
    """Write the session's settings as a Spark properties file for ``spark-submit`` / ``spark-sql``:

        spark-submit --properties-file lake/spark-solaris.conf spark_jobs/ingest_clicklog.py ...
        spark-sql --properties-file lake/spark-solaris.conf -e "SELECT count(*) FROM solaris.request_log"
    """
    path = path or cfg.lake.root_path / "spark-solaris.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} {v}\n" for k, v in spark_conf(cfg).items()))
    return path


if __name__ == "__main__":  # python -m include.spark [--out PATH]: write the properties file, print its path
    import argparse

    from include.config import load_config

    parser = argparse.ArgumentParser(prog="python -m include.spark", description=write_properties.__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="default: <lake root>/spark-solaris.conf")
    parser.add_argument("--config", help="SOLARIS TOML config")
    a = parser.parse_args()
    print(write_properties(load_config(a.config), a.out))
