"""A class-data sharing (CDS) archive for the Spark driver JVM.

Every job, ``spark-submit``, ``spark-sql`` and the SQL entry point starts a driver JVM that loads and
verifies some twenty thousand classes (Spark SQL, Hive's client, Delta) from jars before its first
query. A dynamic CDS archive holds them already parsed: a driver that maps it starts its session
and runs its first query in about 0.6 of the time (benchmarks/RESULTS.md). The archive is built once
per machine by ``python -m include.class_data`` (``make install`` runs it) from a short Spark
session with Delta, and kept beside the Delta jars' list in Ivy's cache, named by what it depends
on (the Java runtime, pyspark, the Delta package). A driver finds it there and maps it; where there
is none, or the JVM finds it does not match, the driver starts as it would without it: the archive
changes how fast a JVM starts, never what it does. ``[spark] class_data_sharing = false`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Flags that keep the JVM quiet about the archive: a driver that cannot use it (another Java
# after an upgrade) runs without it, as it would have anyway, without a warning on every job's console.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def java_binary() -> Path | None:
    """The ``java`` that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(p) if (p := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def archive_path() -> Path | None:
    """Where the archive for this Java, pyspark and Delta package lives (built or not); None
    without a Java runtime."""
    import pyspark

    from include.spark_jars import delta_package, ivy_cache

    java = java_binary()
    if java is None:
        return None
    key = "\n".join([str(java), str(java.stat().st_mtime_ns), os.path.dirname(pyspark.__file__),
                     pyspark.__version__, delta_package()])
    return ivy_cache() / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def size_record(path: Path) -> Path:
    """Beside the archive: its size in bytes as built."""
    return path.with_name(path.name + ".bytes")


def whole(path: Path) -> bool:
    """The archive is there at the size it was built with. A JVM maps the archive's regions as its
    header declares them: a file cut short (a full disk, a copy interrupted) crashes every driver
    with SIGBUS instead of being ignored, so such a file is never handed to one."""
    try:
        return path.stat().st_size == int(size_record(path).read_text())
    except (OSError, ValueError):
        return False


def java_options() -> str:
    """The driver JVM flags that map the archive, or "" where none is built (whole) for this machine."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and whole(path) else ""


# What the session that builds the archive runs: what every SOLARIS job does first (a session with
# Delta and the metastore, tables created, written, merged, read back through Arrow, a Python UDF),
# so the classes of all of it land in the archive.
WORKLOAD = """
import sys
from include.config import SolarisConfig
from include.spark import get_spark

cfg = SolarisConfig().with_overrides(lake={"root": sys.argv[1], "database": "warm"},
                                     spark={"master": "local[1]", "shuffle_partitions": 1,
                                            "driver_java_options": sys.argv[2], "class_data_sharing": False})
spark = get_spark(cfg)
spark.sql("CREATE TABLE IF NOT EXISTS warm.t (k STRING, n BIGINT, e ARRAY<FLOAT>, at TIMESTAMP) USING delta "
          "PARTITIONED BY (k)")
spark.sql("INSERT INTO warm.t SELECT cast(id % 3 AS STRING), id, array(cast(id AS FLOAT)), current_timestamp() "
          "FROM range(50)")
spark.sql("MERGE INTO warm.t AS t USING (SELECT '1' AS k, 1L AS n) AS s ON t.k = s.k AND t.n = s.n "
          "WHEN MATCHED THEN UPDATE SET t.n = s.n + 100 WHEN NOT MATCHED THEN INSERT (k, n) VALUES (s.k, s.n)")
df = spark.table("warm.t")
df.groupBy("k").count().toPandas()
df.mapInPandas(lambda it: (b for b in it), df.schema).count()
spark.sql("SELECT k, n, row_number() OVER (PARTITION BY k ORDER BY n) FROM warm.t").collect()
spark.sql("DESCRIBE HISTORY warm.t").collect()
spark.sql("OPTIMIZE warm.t").collect()
spark.stop()
"""


def build(force: bool = False) -> Path | None:
    """Build the archive for this machine unless it exists (``force``: again); returns its path, or
    None without a Java runtime. The JVM writes the archive as it exits: to a temporary name, moved
    into place once whole, so a driver starting meanwhile never maps half an archive."""
    path = archive_path()
    if path is None or (whole(path) and not force):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="solaris-cds-") as tmp:
        part = Path(tmp) / "archive.jsa"
        flags = f"-XX:ArchiveClassesAtExit={part} {QUIET}"
        p = subprocess.run([sys.executable, "-c", WORKLOAD, str(Path(tmp) / "lake"), flags], cwd=root,
                           capture_output=True, text=True, timeout=1200)
        if p.returncode != 0 or not part.is_file():
            raise RuntimeError(f"the Spark session that builds the class-data archive failed ({p.returncode}):\n"
                               f"{p.stderr[-3000:]}")
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        shutil.move(part, staged)
        size = size_record(path).with_name(f".{path.name}.bytes.{os.getpid()}")
        size.write_text(f"{staged.stat().st_size}\n")
        staged.replace(path)
        size.replace(size_record(path))
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m include.class_data",
                                description="Build the Spark driver's class-data sharing archive for this machine "
                                            "(once; make install runs it).")
    p.add_argument("--force", action="store_true", help="build it again even if it exists")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    path = archive_path()
    had = path is not None and whole(path)
    path = build(force=a.force)
    if path is None:
        print("no Java runtime found (JAVA_HOME or java on PATH): nothing to build", file=sys.stderr)
        return 1
    print(f"class-data archive {'kept' if had and not a.force else 'built'}: {path} "
          f"({path.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
