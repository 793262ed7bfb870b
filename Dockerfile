# One image for every SOLARIS container: the Spark master and workers, the jobs, Airflow.
# The Delta jars are resolved at build time, so nothing is downloaded when containers run.
FROM python:3.11-slim-bookworm

RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
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
RUN pip install --no-cache-dir --no-deps -e . \
    && SOLARIS_LAKE_ROOT=/tmp/bake python -c "from include.config import load_config; from include.spark import get_spark; get_spark(load_config()).stop()" \
    && rm -rf /tmp/bake
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
