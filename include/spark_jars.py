"""The Delta Lake jars of the Spark session: the Maven package matching the installed delta-spark and
pyspark, resolved by Ivy once and then taken from its cache as local files."""

from __future__ import annotations

import os
from pathlib import Path


# Artifacts that Delta's POM pulls in transitively and that Spark already ships in its own jars/
# folder (at other versions: Hadoop 3.4.2 against 3.4.1, Parquet 1.16 against 1.15, Jackson 2.13
# against 2.18). On the classpath twice they change nothing (Spark's copy loads first) but cost
# every JVM start about 4 s of jar scanning (log4j's plugin scan opens every jar), and a job runs
# one per spark-submit. Only Delta's own jars (delta-spark, delta-storage, delta-kernel-*,
# unitycatalog-*) and the few it needs that Spark lacks are added.
SPARK_PROVIDED = (
    "com.fasterxml.jackson.core:jackson-annotations", "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind", "com.github.luben:zstd-jni",
    "com.google.code.findbugs:jsr305", "commons-pool:commons-pool", "io.airlift:aircompressor",
    "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.logging.log4j:log4j-api", "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl", "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common", "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures", "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson", "org.roaringbitmap:RoaringBitmap", "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
)


def delta_package() -> str:
    """The Maven coordinate of the Delta jars matching the installed delta-spark and pyspark.

    Spark resolves it from Maven Central on first use and keeps it in the Ivy cache (~/.ivy2*).
    """
    from importlib.metadata import version

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_2.13:{version('delta-spark')}"


def ivy_cache() -> Path:
    """Where SOLARIS keeps what it derives from Ivy's cache: the Delta jars' list, the driver's
    class-data archive (include/class_data.py)."""
    return Path(os.environ.get("SOLARIS_IVY_HOME", Path.home() / ".ivy2.5.2")) / "solaris"


def jar_manifest() -> Path:
    """Where the Delta jars that Ivy resolved for this package are listed (beside Ivy's cache)."""
    return ivy_cache() / (delta_package().replace(":", "_") + ".jars")


def delta_jars() -> dict[str, str]:
    """The Delta jars for the session: the local jar files Ivy resolved before (listed in
    ``jar_manifest``), or, on first use or when one is gone, the Maven package for Ivy to resolve.
    Resolving again on every start costs a second of look-ups (some of repositories this machine
    may not reach) and forty lines of Ivy's report on every job's console."""
    manifest = jar_manifest()
    try:
        jars = [j for j in manifest.read_text().split() if j]
    except OSError:
        jars = []
    if jars and all(Path(j).is_file() for j in jars):
        return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": delta_package(), "spark.jars.excludes": ",".join(SPARK_PROVIDED)}


def remember_jars(spark) -> None:
    """After Ivy resolved the package: list the jar files it put on the classpath (``delta_jars``)."""
    from urllib.parse import urlparse

    conf = spark.sparkContext.getConf()
    if not conf.get("spark.jars.packages", ""):
        return
    jars = [urlparse(j).path for j in conf.get("spark.jars", "").split(",") if j]
    if not jars or not all(Path(j).is_file() for j in jars):
        return
    manifest = jar_manifest()
    try:
        manifest.parent.mkdir(parents=True, exist_ok=True)
        tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("\n".join(jars) + "\n")
        tmp.replace(manifest)  # atomic: a concurrent start reads the old list or the new one
    except OSError:
        pass  # a read-only home: resolve again next time
