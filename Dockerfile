# One image for every SOLARIS container: the Spark master and workers, the jobs, Airflow, the lookup.
# The Delta jars are resolved at build time, so nothing is downloaded when containers run.
#
# The base is a build argument: any Debian bookworm with Python 3.11 (python3 and its venv module).
# The default is the public python:3.11-slim-bookworm; where registries cannot be reached, a local
# bookworm made with debootstrap serves (docker/local-base makes one). The dependencies live in
# a virtualenv at /opt/venv, so both bases give the same paths (SPARK_HOME below).
#
# Layers are ordered by how often they change: system packages, then the pinned dependencies (the
# slow layer: torch alone is several GB), then the Delta jars, then the code. Editing the code
# rebuilds only the last layers.
#
# Containers run as the unprivileged user solaris (uid 1000), who owns the lake, the input folder
# (/data) and Airflow's home.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 solaris \
    && mkdir -p /lake /data /opt/airflow /opt/solaris \
    && chown solaris:solaris /lake /data /opt/airflow
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    SOLARIS_LAKE_ROOT=/lake \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/solaris
COPY requirements.txt requirements.lock ./
RUN python3 -m venv /opt/venv \
    && pip install --no-cache-dir -r requirements.txt -c requirements.lock

# The Delta jars land in solaris's Ivy cache, where the jobs look for them. Only include/ (the
# session factory) is needed for that, so a change elsewhere in the code keeps this layer.
COPY include include
USER solaris
RUN SOLARIS_LAKE_ROOT=/tmp/bake python -c "from include.config import load_config; from include.spark import get_spark; get_spark(load_config()).stop()" \
    && rm -rf /tmp/bake
USER root

COPY pyproject.toml ./
COPY feature_store feature_store
COPY lookup lookup
COPY spark_jobs spark_jobs
COPY model model
COPY experiments experiments
COPY examples examples
COPY dags dags
RUN pip install --no-cache-dir --no-deps -e .
USER solaris
# Commands run from the shared input volume, so what they write relative to their folder (the main
# job's reports/, say) outlives a one-off container: `docker compose run --rm solaris` leaves its
# report in /data/reports.
WORKDIR /data
