"""No model figure from a leaking log: training refuses a source whose generated candidates failed
the ingest's leak check, and with the override every figure is marked and no transfer ratio shown."""

import os
import subprocess
import sys

import pytest

from include import synthetic
from model import training
from model.data import LeakingCandidates, candidate_leaks
from spark_jobs import ingest_clicklog as ic

from tests.conftest import TINY, _test_config, ensure_database

pytestmark = pytest.mark.spark

SPARSE = synthetic.SyntheticConfig(users=300, items=5000, hours=36, visits_per_hour=8)


def ingest_sparse(spark, root, name, tmp_path_factory, **clicklog):
    cfg = _test_config(root / name, database=f"t_{name}")
    if clicklog:
        cfg = cfg.with_overrides(clicklog=clicklog)
    ensure_database(spark, cfg)
    path = tmp_path_factory.mktemp(name) / "clicks.csv"
    synthetic.write_csv(synthetic.generate(SPARSE), path)
    spec = ic.ClickLogSpec(source="clicklog", mapping=ic.PRESETS["generic"]["mapping"])
    return cfg, ic.ingest(spark, cfg, str(path), spec)


@pytest.fixture(scope="module")
def leaking(spark, lake_root, tmp_path_factory):
    """A sparse log whose negatives come from the hour before each click (the generator's first
    form): every negative had a recent click and the clicked item rarely did."""
    return ingest_sparse(spark, lake_root, "leaking", tmp_path_factory, pool="before")


def test_a_sparse_log_ingests_clean_with_the_default_pool(spark, lake_root, tmp_path_factory):
    cfg, report = ingest_sparse(spark, lake_root, "sparse_clean", tmp_path_factory)
    assert report.leaks == () and report.candidates == "generated", report
    assert 0.40 <= report.popularity_auc <= 0.65 and 0.40 <= report.recent_click_auc <= 0.65
    assert candidate_leaks(cfg, "clicklog") == []


def test_the_leak_is_found_at_ingest_and_recorded(leaking):
    cfg, report = leaking
    assert any(f.startswith("recent click AUC") for f in report.leaks), report
    assert any("WARNING: recent click AUC" in line for line in report.lines(cfg.lake.database))
    assert report.candidates == "generated"
    found = candidate_leaks(cfg, "clicklog")
    assert found and all(f.startswith(report.input_path + ": ") for f in found)
    assert candidate_leaks(cfg, "another_source") == []


def test_logged_impressions_are_reported_not_judged(base_lake):
    """The synthetic impression world's logging policy shows popular items (prior popularity AUC
    about 0.7): a real effect of an impression log, reported at ingest and never refused."""
    assert candidate_leaks(base_lake, "synthetic") == []


def test_training_refuses_a_leaking_source_in_one_line(leaking):
    cfg, _ = leaking
    with pytest.raises(LeakingCandidates, match=r"refusing to train on source 'clicklog'.*prior popularity AUC 0\.\d+ "
                                                r"\(and \d more\), outside \[0.4, 0.65\].*--allow-leaking-candidates"):
        training.train_all(cfg, "clicklog", TINY, log=lambda *_: None)
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(cfg.lake.root_path)}
    p = subprocess.run([sys.executable, "-m", "experiments.model_eval", "--source", "clicklog", "--skip-ingest"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.count("\n") == 1 and "refusing to train on source 'clicklog'" in p.stderr


def test_with_the_override_every_figure_is_marked_and_no_transfer_ratio_shown(leaking):
    cfg, _ = leaking
    allowed = cfg.with_overrides(quality={"allow_leaking_candidates": True})
    result = training.train_all(allowed, "clicklog", TINY, log=lambda *_: None)
    assert result["leaking_candidates"] == candidate_leaks(cfg, "clicklog")
    md = training.to_markdown(result)
    assert "**LEAKING CANDIDATES: every figure below comes from generated candidates" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == 6 and all("(leaking candidates)" in line for line in rows)  # 4 models, 2 baselines
    for line in rows:
        if line.startswith(("| VM + ", "| VM + ")):
            assert line.endswith("| n/a: leaking candidates |"), line
        else:  # the VM, the FM and the baselines have no transfer ratio at all
            assert line.endswith("|  |"), line


def test_a_log_from_before_2000_ingests_and_trains(spark, lake_root, tmp_path_factory):
    """A 1997 click log in epoch seconds (MovieLens-era dates) lands whole and trains: the accepted
    range starts at 1970, and a seconds log read as milliseconds is still caught by its own reason."""
    from dataclasses import replace

    cfg = _test_config(lake_root / "old_log", database="t_old_log")
    ensure_database(spark, cfg)
    cols = synthetic.generate(replace(SPARSE, start="1997-09-20T00:00:00", items=300, visits_per_hour=20))
    cols["ts"] = cols["ts"] // 1000  # epoch seconds
    path = tmp_path_factory.mktemp("old_log") / "clicks.csv"
    n = synthetic.write_csv(cols, path)
    seconds = ic.ClickLogSpec(source="clicklog", mapping=ic.PRESETS["generic"]["mapping"], ts_unit="s")
    report = ic.ingest(spark, cfg, str(path), seconds)
    assert (report.requests, report.quarantined) == (n, 0) and report.min_ts.year == 1997
    assert report.leaks == ()
    result = training.train_all(cfg, "clicklog", TINY, log=lambda *_: None)
    assert str(result["window"]["test"]["from"]).startswith("1997-09-2")
    assert all(0 < r["ne"] < 10 for r in result["rows"] + result["baselines"])
    ms = _test_config(lake_root / "old_log_ms", database="t_old_log_ms")
    ensure_database(spark, ms)
    wrong = ic.ingest(spark, ms, str(path), replace(seconds, ts_unit="ms"))
    assert wrong.requests == 0 and wrong.quarantined == n
    assert "every record was quarantined as 'timestamp looks like seconds read as milliseconds" in \
        "\n".join(wrong.lines(cfg.lake.database))


def test_a_user_who_browses_one_category_is_a_leak_the_user_side_check_finds(spark, lake_root, tmp_path_factory):
    """Each user clicks, again and again, the few items of one category, and the generator draws the
    negatives from the whole catalogue (the clicks of other users that follow): the clicked item
    continues what the user was browsing and a negative does not. The item's side reads nothing
    there; each user-side statistic separates the labels by itself, and training refuses the log."""
    import numpy as np
    import pandas as pd

    from model.data import require_leak_free

    rng = np.random.default_rng(5)
    n_users, n_categories, per_category = 160, 32, 5
    home = rng.integers(0, n_categories, n_users)
    rows = []
    for u in range(n_users):
        for ms in np.sort(rng.integers(0, 24 * 3600 * 1000, 12)):
            item = home[u] * per_category + rng.integers(0, per_category)
            rows.append((f"u{u}", f"i{item}", 1767571200000 + int(ms), "1", "0", "0", "1", f"c{home[u]}"))
    path = tmp_path_factory.mktemp("browsing") / "clicks.csv"
    pd.DataFrame(rows, columns=["user_id", "item_id", "ts", "surface", "device", "region", "referrer",
                                "category"]).to_csv(path, index=False)
    cfg = _test_config(lake_root / "browsing", database="t_browsing")
    ensure_database(spark, cfg)
    spec = ic.ClickLogSpec(source="browsing", mapping={**ic.PRESETS["generic"]["mapping"], "category": "category"})
    report = ic.ingest(spark, cfg, str(path), spec)

    assert all(0.40 <= v <= 0.65 for v in (report.popularity_auc, report.recent_click_auc, report.known_item_auc,
                                            report.position_auc)), report  # the item's side sees nothing
    for label, value in (("same category as the last click", report.same_category_auc),
                         ("share of recent clicks in the category", report.category_share_auc),
                         ("clicked by the user before", report.interacted_before_auc)):
        assert value > 0.65 and f"{label} AUC {value:.3f}" in report.leaks, (label, report)
    assert any(line.startswith("  WARNING: same category as the last click AUC") for line in report.lines("t_browsing"))
    run = spark.table("t_browsing.ingest_runs").collect()[0]
    assert (run.same_category_auc, run.category_share_auc, run.interacted_before_auc) == \
        (report.same_category_auc, report.category_share_auc, report.interacted_before_auc)
    # the advice fits the finding: the default pool is what leaks here, so it is not offered
    with pytest.raises(LeakingCandidates, match=r"refusing to train on source 'browsing'.*: same category as the last "
                                                r"click AUC 0\.\d+ \(and 2 more\).*not what a ranker would show this user.*"
                                                r"--data impressions.*--allow-leaking-candidates") as refused:
        require_leak_free(cfg, "browsing")
    assert "default [clicklog] pool" not in str(refused.value)
