# SOLARIS: `make demo` runs the main job on the embedded default, `make test` runs the test suite.
# Both create the virtualenv and install the pinned dependencies first.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast test-compose evaluate session-features serve airflow sql spark-sql bench-ingest bench-cycles clean help

help:
	@echo "make demo    - install, then run the main job on a synthetic log (local Spark, Delta lake in ./lake)"
	@echo "make test    - install, then run the whole test suite"
	@echo "make test-fast           - only the tests that need nothing but Python (marker unit; seconds)"
	@echo "make test-compose        - docker compose up the whole stack in a Docker engine of its own and run an hourly DAG on it (root)"
	@echo "make evaluate DATA=synthetic|mind|globo - replay evaluation, report in reports/replay_DATA/ (lake in lake-eval/DATA; ARGS=--window quick: a few hours)"
	@echo "make session-features DATA=... - after make evaluate: its VM variants again, reading the user's last click"
	@echo "make serve               - the online lookup service on 127.0.0.1:8765 over ./lake"
	@echo "make airflow             - Airflow standalone (SQLite) with the SOLARIS DAGs on http://127.0.0.1:8080 (AIRFLOW_PORT=...)"
	@echo "make sql Q='SELECT ...'  - run SQL over the feature tables"
	@echo "make spark-sql           - interactive spark-sql on the same catalog"
	@echo "make bench-ingest        - ingestion benchmark on the real logs in ../shared/datasets"
	@echo "make bench-cycles        - 24 hourly cycles over the whole Globo log, seconds per stage"

$(STAMP): requirements.txt requirements.lock pyproject.toml
	@command -v java >/dev/null || { echo "Java 17 is required for Spark (Debian: apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
	@test -n "$(PYTHON)" || { echo "Python 3.11 is required" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -c "import pyspark.sql, delta, torch, faiss, great_expectations, deltalake, airflow; print('installed: pyspark', pyspark.__version__, '| torch', torch.__version__)"
	@touch $@

# The Delta jars (from Maven Central) and the Spark driver's class-data archive for this machine's Java
# (a driver JVM starts in about 0.6 of the time; include/class_data.py): built once, a second after.
install: $(STAMP)
	@$(PY) -m include.class_data

demo: install
	$(PY) -m spark_jobs.pipeline $(ARGS)

# PYTEST_WORKERS=N runs the suite on N pytest-xdist workers, each test module whole on one of them
# and the two modules over the demo lake together (tests/conftest.py). The default, 0, is one
# process: on a 2-core machine two workers were no faster (the Spark jobs already use both cores).
PYTEST_WORKERS ?= 0
test: install
	$(PY) -m tests.maven_jars
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The inner loop: tests marked unit (no Spark, Airflow, browser, Redis or Compose). Markers in pyproject.toml.
test-fast: $(STAMP)
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

# docker-compose.yml for real (tests/test_compose_stack.py): its own dockerd, the images built from a
# local Debian base, `docker compose up`, the demo log and one hourly DAG run on the stack. Root,
# Debian's docker.io and debootstrap, and minutes: not part of `make test`.
test-compose: install
	SOLARIS_TEST_COMPOSE_STACK=1 $(PY) -m pytest -s tests/test_compose_stack.py $(PYTEST_ARGS)

# Replay evaluation (experiments/replay.py) in a lake of its own per data set. The real logs default
# to ../shared/datasets; Globo replays the whole histories of 5% of its users (SAMPLE=1: all).
DATA ?= synthetic
INPUT_mind  := ../shared/datasets/mind_small_subset
INPUT_globo := ../shared/datasets/globo_news_clicks/clicks/*.csv.gz
SAMPLE_globo := 0.05
INPUT  ?= $(INPUT_$(DATA))
SAMPLE ?= $(SAMPLE_$(DATA))
EVAL_LAKE ?= lake-eval/$(DATA)

evaluate: install
	SOLARIS_LAKE_ROOT="$(EVAL_LAKE)" $(PY) -m experiments.replay --data $(DATA) $(if $(INPUT),--input '$(INPUT)') \
		$(if $(SAMPLE),--sample-fraction $(SAMPLE)) $(ARGS)

# After make evaluate: every VM variant of that replay trained again reading the user's last click
# (an online session feature), on the same rows and seeds; report beside the replay's
session-features: install
	SOLARIS_LAKE_ROOT="$(EVAL_LAKE)" $(PY) -m experiments.session_features --data $(DATA) $(ARGS)

serve: install
	$(PY) -m lookup.serve $(ARGS)

# Airflow's embedded default: SQLite metadata under ./airflow, this project's DAGs, Spark jobs on
# local Spark through the solaris_spark connection. The login is printed by `airflow standalone`
# (and kept in airflow/simple_auth_manager_passwords.json.generated). DAGs start paused.
AIRFLOW_DIR  ?= airflow
AIRFLOW_PORT ?= 8080
AIRFLOW_ENV = AIRFLOW_HOME="$(abspath $(AIRFLOW_DIR))" AIRFLOW__CORE__DAGS_FOLDER="$(abspath dags)" \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True \
	AIRFLOW__API__HOST=127.0.0.1 AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$(AIRFLOW_PORT)/execution/ \
	AIRFLOW_CONN_SOLARIS_SPARK='{"conn_type": "spark", "host": "local[*]"}' \
	PATH="$(abspath $(VENV))/bin:$$PATH"

airflow: install
	@echo "Airflow UI: http://127.0.0.1:$(AIRFLOW_PORT)  (user admin; password printed below and in $(AIRFLOW_DIR)/simple_auth_manager_passwords.json.generated)"
	$(AIRFLOW_ENV) $(VENV)/bin/airflow standalone

sql: install
	@test -n "$(Q)" || { echo "usage: make sql Q='SELECT count(*) FROM solaris.request_log'" >&2; exit 2; }
	$(PY) -m include.sql "$(Q)"

spark-sql: install
	PATH="$(abspath $(VENV))/bin:$$PATH" spark-sql --properties-file "$$($(PY) -m include.spark)"

bench-ingest: install
	$(PY) benchmarks/bench_ingest.py

bench-cycles: install
	$(PY) benchmarks/bench_hourly_cycles.py

clean:
	rm -rf lake lake-eval data benchmarks/out .pytest_cache airflow
