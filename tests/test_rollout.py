"""A new FM and autoencoder rolled out through the DAGs in the middle of a run of hourly cycles:
``airflow dags test`` of solaris_train and solaris_backfill on one lake (the hours served before the
rollout run in the test's own Spark session), with the lookup serving it
over HTTP throughout. The consumer is never answered, and no request is ever resolved, in a code
space other than the one its promoted SOLARIS VM reads; during the rollout both spaces are written
and the new one is resolved in shadow; the switch is one publication, with no hour of ``none``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, _test_config, airflow_home, copy_lake

pytestmark = pytest.mark.airflow


def airflow_runner(cfg, tmp_path, db):
    """``dags test <dag> -c conf`` on the lake of ``cfg`` (its config file, local Spark) and a copy of
    the migrated Airflow database ``db``, each run at its own logical date; fails the test with the
    log's tail unless the run succeeded."""
    cfg_file = tmp_path / "solaris.toml"
    cfg_file.write_text(f'[lake]\nroot = "{cfg.lake.root_path}"\ndatabase = "{cfg.lake.database}"\n'
                        '[spark]\nmaster = "local[2]"\nshuffle_partitions = 2\ndriver_memory = "2g"\n'
                        '[models]\nserved_min_rows = 50\n')  # a tiny world serves few rows an hour
    env = {**os.environ, "AIRFLOW_HOME": str(airflow_home(db, tmp_path / "airflow")), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "SOLARIS_CONFIG": str(cfg_file),
           "AIRFLOW_CONN_SOLARIS_SPARK": '{"conn_type": "spark", "host": "local[2]"}',
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}  # the spark-submitted jobs import this checkout, whatever the venv installed
    env.pop("SOLARIS_LAKE_ROOT", None)
    airflow = [sys.executable, "-m", "airflow"]
    runs = iter(range(1, 100))

    def dag(dag_id: str, **conf) -> str:
        day = f"2026-02-{next(runs):02d}"
        p = subprocess.run(airflow + ["dags", "test", dag_id, day, "-c", json.dumps(conf)], env=env,
                           capture_output=True, text=True, timeout=1800, cwd=ROOT)
        out = p.stdout + p.stderr
        assert p.returncode == 0 and "state=success" in out.replace("state: success", "state=success"), out[-6000:]
        return out

    return dag


@pytest.mark.timeout(1800)  # 300-700 s of airflow dags test and hourly cycles on two cores
def test_a_rollout_never_answers_a_consumer_in_another_code_space(spark, lake_root, base_lake, airflow_db, tmp_path):
    from deltalake import DeltaTable

    from lookup.client import LookupClient
    from lookup.online import OnlineStore
    from lookup.app import ConsumerCodeSpaces
    from lookup.server import LookupServer
    from include.config import load_config
    from model import registry

    import threading
    from datetime import datetime

    from spark_jobs import cycle

    # Day 1: the shared lake's tiny model set (code space A); no consumer reads codes yet, so A is
    # served. These two hours are what the rollout starts from, not part of it: they run in this
    # session's warm driver (the cycles solaris_backfill runs) instead of a DAG run of their own.
    lake = copy_lake(spark, base_lake, _test_config(lake_root / "rollout", database="t_rollout"))
    for hour in (5, 6):
        cycle.run(spark, lake, datetime(2026, 1, 5, hour), log=lambda *_: None)
    dag = airflow_runner(lake, tmp_path, airflow_db)
    cfg = load_config(tmp_path / "solaris.toml")
    tables, models = cfg.lake.tables_path, cfg.models_root

    def table(name):
        return DeltaTable(str(tables / name)).to_pandas()

    def consumer_space():
        return registry.consumer_code_version(models, "click")

    a = registry.code_version(registry.resolve_models(cfg))

    # Day 2: the daily DAG trains a new FM and autoencoder (B, of the same code size) and the
    # consumer's first SOLARIS VM, on what A served: the rollout starts.
    out = dag("solaris_train", sizes="tiny", tolerance=10.0)
    b = registry.code_version(registry.resolve_models(cfg))
    assert b != a and consumer_space() == a, out[-3000:]
    spaces = registry.code_spaces(cfg)
    assert (spaces.serving, spaces.newest, set(spaces.models)) == (a, b, {a, b})

    store = OnlineStore(tables, poll_seconds=0.2, record_misses=False).start()
    server = LookupServer(store, "127.0.0.1", 0, allow_client_now=True, consumers=ConsumerCodeSpaces(models, 0.0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    def ask(hour: str, **who) -> list[str]:
        """Every user of the hour's exact rows, as the consumer (or a caller of a named code space)
        asks at the hour; a consumer is answered only in the space its promoted VM reads."""
        store.poll_once()
        pairs = table("pair_embeddings")
        pairs = pairs[pairs["run_id"] == hour]
        got = []
        with LookupClient(server.url) as c:
            for user, items in pairs.groupby("user_id")["item_id"]:
                _, tiers, run_id = c.lookup(user, sorted(set(items)), now=pd.Timestamp(hour).to_pydatetime(), **who)
                assert run_id == hour
                if "consumer" in who:
                    assert c.last_code_version == consumer_space(), (hour, user)
                got += tiers
        return got

    try:
        # The rollout: both spaces written, A served, B resolved in shadow.
        dag("solaris_backfill", start="2026-01-05T06:00:00", end="2026-01-05T08:00:00")
        assert "exact" in ask("2026-01-05T08:00:00", consumer="click")
        assert "exact" in ask("2026-01-05T08:00:00", code_version=b)  # a consumer already on B: the shadow answers

        # Day 3: the consumers retrained on B's shadow rows and promoted. The 08:00 publication still
        # serves A, and the consumer, now on B, is answered from its shadow at once: no hour of none.
        out = dag("solaris_train", sizes="tiny", tolerance=10.0, retrain="consumers")
        assert f"rollout: the consumers learn code space {b}" in out and consumer_space() == b
        assert "exact" in ask("2026-01-05T08:00:00", consumer="click")

        # The next publications serve B alone; a caller of A gets none, counted.
        dag("solaris_backfill", start="2026-01-05T08:00:00", end="2026-01-05T10:00:00")
        assert "exact" in ask("2026-01-05T10:00:00", consumer="click")
        assert set(ask("2026-01-05T10:00:00", code_version=a)) == {"none"}
        assert store.status()["code_version_mismatches"] > 0
    finally:
        server.shutdown()
        server.server_close()
        store.stop()

    # The publications: one switch, A then B; the shadow named while the rollout ran.
    pubs = table("feature_versions").sort_values("interval_end")
    assert [(r.run_id[11:16], r.code_version, r.shadow_code_version if isinstance(r.shadow_code_version, str) else None)
            for r in pubs.itertuples()] == [("05:00", a, None), ("06:00", a, None), ("07:00", a, b), ("08:00", a, b),
                                            ("09:00", b, None), ("10:00", b, None)]
    runs = table("precompute_runs").set_index("run_id").sort_index()
    assert list(runs["rollout_code_version"].fillna("-")) == ["-", "-", a, a, "-", "-"]
    pairs = table("pair_embeddings")
    assert set(pairs["model_version"]) == {a, b}
    assert set(pairs.loc[pairs["run_id"] == "2026-01-05T09:00:00", "model_version"]) == {b}
    means = table("user_mean_embeddings")
    assert set(means["code_version"]) == {a, b}

    # Every request was resolved in the space its publication served, and the shadow in the new one.
    served = table("request_features").merge(pubs[["run_id", "code_version"]].rename(
        columns={"run_id": "snapshot_run_id", "code_version": "published"}), on="snapshot_run_id", how="left")
    with_snapshot = served[served["snapshot_run_id"].notna()]
    assert len(with_snapshot) and (with_snapshot["code_version"] == with_snapshot["published"]).all()
    assert set(with_snapshot["code_version"]) == {a, b}  # [09:00, 10:00) was served by the switched publication
    shadow = table("shadow_request_features")
    assert len(shadow) and set(shadow["code_version"]) == {b}
    ts = pd.to_datetime(shadow["ts"], utc=True)
    assert ts.min() >= pd.Timestamp("2026-01-05T07:00:00Z") and ts.max() < pd.Timestamp("2026-01-05T09:00:00Z")

    # The rollout experiment's hour-by-hour arms (experiments/rollout.py) on this lake: the consumer
    # trained on A (v0001) and on B (v0002), scored on the same candidates in both code spaces.
    from experiments import rollout
    from model import data as mdata
    from model.inference import load_vm
    from model.metrics import normalized_entropy

    start, switch, end = (pd.Timestamp(f"2026-01-05T{h}:00:00").to_pydatetime() for h in ("07", "08", "09"))
    old = rollout.rows_of(cfg, tables, start, end, None, "request_features", a)
    new = rollout.rows_of(cfg, tables, start, end, None, "shadow_request_features", b)
    vm_a, vm_b = (load_vm(str(registry.resolve(models, "vm_click_solaris", v)), cfg.allowed_classes)
                  for v in ("v0001", "v0002"))
    events, items = mdata.events_and_items(cfg)
    dim = registry.autoencoder_code_dim(registry.resolve(models, "autoencoder"))
    hours = rollout.hourly(old, new, vm_a, vm_b, switch, events, items, dim, resamples=50)
    assert [h["hour"][11:16] if h["hour"][0].isdigit() else h["hour"] for h in hours] == \
        ["07:00", "08:00", "before the switch", "after the switch"]
    assert sum(h["rows"] for h in hours[:2]) == sum(h["rows"] for h in hours[2:]) == len(old) == len(new)
    for h in hours:
        assert all(np.isfinite(h[arm]["ne"]) for arm in rollout.ARMS)
        if not h["after_switch"]:
            assert h["protocol"]["ne"] == h["no rollout"]["ne"]
    last = new[new["ts"] >= pd.Timestamp(switch)]
    assert not hours[0]["after_switch"] and hours[1]["after_switch"]
    assert hours[1]["protocol"]["ne"] == hours[-1]["protocol"]["ne"] == pytest.approx(
        normalized_entropy(last["label"].to_numpy(), rollout.predict(*vm_b, last, events, items, dim)))
    assert "| 01-05 08:00 (switched) |" in rollout.to_markdown(
        {"window": dict.fromkeys(("start", "promote", "switch", "end"), "-"), "vm_a_rows": 1, "vm_b_rows": 1, "seed": 7,
         "hours": hours})
