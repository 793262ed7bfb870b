# One image for every SOLARIS container: the Spark master and workers, the jobs, Airflow, the lookup.
# The Delta jars are resolved at build time, so nothing is downloaded when containers run. The base
# is a build argument (a local Debian bookworm with Python 3.11 serves where registries cannot be
# reached). Containers run as the unprivileged user solaris, who owns the lake and Airflow's home.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 solaris \
    && mkdir -p /lake /opt/airflow /opt/solaris && chown solaris:solaris /lake /opt/airflow
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    SPARK_LOCAL_IP="" \
    SOLARIS_LAKE_ROOT=/lake \
    PYTHONUNBUFFERED=1

WORKDIR /opt/solaris
COPY requirements.txt requirements.lock pyproject.toml ./
RUN pip install --no-cache-dir -r requirements.txt -c requirements.lock
COPY include include
COPY feature_store feature_store
COPY spark_jobs spark_jobs
COPY model model
COPY experiments experiments
COPY dags dags
RUN pip install --no-cache-dir --no-deps -e .
USER solaris
# The Delta jars land in solaris's Ivy cache, where the jobs look for them.
RUN SOLARIS_LAKE_ROOT=/tmp/bake python -c "from include.config import load_config; from include.spark import get_spark; get_spark(load_config()).stop()" \
    && rm -rf /tmp/bake
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
