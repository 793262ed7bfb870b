"""Training every model on a tiny ingested log, through the same code as `python -m experiments.model_eval`."""

import json
import math
import os
import subprocess
import sys

import pytest

from model import data as mdata
from model import baselines, registry, training
from model.fm import FMConfig, FoundationModel

from tests.conftest import TINY, copy_lake

pytestmark = pytest.mark.spark



@pytest.fixture(scope="module")
def tiny_lake(spark, lake_root, base_lake):
    """The shared tiny log, without its models: these tests train their own."""
    from tests.conftest import _test_config

    return copy_lake(spark, base_lake, _test_config(lake_root / "model_eval", database="t_model_eval"), models=False)


@pytest.fixture(scope="module")
def trained(tiny_lake):
    """One training of the tiny model set on the module's lake, shared by the tests that read it."""
    return training.train_all(tiny_lake, "synthetic", TINY, log=lambda *_: None)


def test_every_variant_trains_and_is_reported(tiny_lake, trained):
    result = trained
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == ["VM", "VM + KD (soft labels)", "VM + FM embedding (oracle coverage)", "FM"]
    for r in rows.values():
        assert math.isfinite(r["ne"]) and 0 <= r["auc"] <= 1 and r["params"] > 0 and r["flops_per_pair"] > 0
    ne_vm, ne_fm = rows["VM"]["ne"], rows["FM"]["ne"]
    x = rows["VM + KD (soft labels)"]
    if ne_fm < ne_vm:
        assert x["transfer_ratio"] == pytest.approx((ne_vm - x["ne"]) / (ne_vm - ne_fm))
    else:
        assert math.isnan(x["transfer_ratio"])
    assert rows["VM"]["ne_vs_vm_pct"] == 0.0
    w = result["window"]
    assert w["train"]["to"] <= w["val"]["from"] <= w["val"]["to"] <= w["test"]["from"]  # split by time, no overlap
    assert set(result["autoencoder"]) == {"reconstruction_mse", "embedding_variance", "fm_head_ne_original",
                                          "fm_head_ne_reconstructed"}
    fm = registry.load(registry.resolve(tiny_lake.lake.root_path / "models", "fm"), FoundationModel, FMConfig)
    assert fm.cfg.embedding_dim == 16
    assert "vocab.json" in os.listdir(result["models"]["vm_click_oracle"])
    md = training.to_markdown(result)
    assert "Paper reference" in md
    # Every number with its paired-bootstrap interval; the transfer ratio only where the FM wins.
    assert result["bootstrap"]["resamples"] == TINY.bootstrap_resamples and result["bootstrap"]["groups"] == w["test"]["requests"]
    for r in rows.values():
        assert r["ne_ci"][0] <= r["ne"] <= r["ne_ci"][1] and r["auc_ci"][0] <= r["auc"] <= r["auc_ci"][1]
        assert r["ne_vs_vm_pct_ci"][0] <= r["ne_vs_vm_pct"] <= r["ne_vs_vm_pct_ci"][1]
    assert result["fm_beats_vm"] == (rows["FM"]["ne_vs_vm_pct_ci"][1] < 0)
    kd_line = next(line for line in md.splitlines() if line.startswith("| VM + KD"))
    assert ("n/a: FM not better" in kd_line) == (not result["fm_beats_vm"])
    assert f"paired bootstrap over the {w['test']['requests']:,} test requests" in md
    # the baselines every user understands, on the same test rows, with their intervals against the VM
    base = {r["model"]: r for r in result["baselines"]}
    assert list(base) == [baselines.POPULARITY, baselines.MF] and base[baselines.MF]["params"] > 0
    for r in base.values():
        assert r["ne_ci"][0] <= r["ne"] <= r["ne_ci"][1] and r["ne_vs_vm_pct_ci"][0] <= r["ne_vs_vm_pct"] <= r["ne_vs_vm_pct_ci"][1]
        line = next(line for line in md.splitlines() if line.startswith(f"| {r['model']} |"))
        assert line.endswith("|  |")  # a baseline has no transfer ratio


@pytest.mark.parametrize("argv, message", [
    (["--data", "mind", "--input", "x", "--ts-unit", "s"],
     "--ts-unit applies to logs read through a column mapping (--data clicklog, globo or impressions), not to "
     "--data mind, whose format is fixed; to read a file of another layout, give it as --data impressions"),
    (["--data", "synthetic", "--ts-unit", "s", "--map", "ts=time"],
     "--map and --ts-unit apply to logs read through a column mapping"),
    (["--skip-ingest", "--ts-unit", "s"], "--ts-unit describes the log to ingest: give it with --data and --input"),
])
def test_log_options_for_a_log_of_a_fixed_format_are_refused_with_what_works(argv, message, capsys):
    from experiments import model_eval

    p = model_eval.arguments("python -m experiments.model_eval", "")
    with pytest.raises(SystemExit) as e:
        model_eval.prepare(p, p.parse_args(argv))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_popularity_baseline_is_the_smoothed_item_rate():
    rate = baselines.item_rate(["a", "a", "a", "b"], [1, 1, 0, 0], ["a", "b", "new"], prior_rows=2.0)
    base = 0.5
    assert rate == pytest.approx([(2 + 2 * base) / (3 + 2), (0 + 2 * base) / (1 + 2), base])


def test_empty_window_is_a_clear_error(tiny_lake):
    with pytest.raises(ValueError, match="no labelled requests .* 'nothing': empty training window"):
        mdata.load(tiny_lake, "nothing")


def test_missing_tables_are_a_clear_error(make_cfg):
    with pytest.raises(FileNotFoundError, match="table request_log not found .*: ingest a log first"):
        mdata.load(make_cfg("no_tables"), None)


def test_command_line_entry_point(tiny_lake, tmp_path):
    env = {**os.environ, "SOLARIS_LAKE_ROOT": str(tiny_lake.lake.root_path)}
    p = subprocess.run([sys.executable, "-m", "experiments.model_eval", "--source", "synthetic", "--skip-ingest", "--models", "quick",
                        "--reports", str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| VM + FM embedding (oracle coverage) |" in p.stdout
    assert "Bayes NE (predicting the true click probability)" in p.stdout  # the world's truth, read by the evaluation
    saved = json.loads((tmp_path / "model_eval_synthetic.json").read_text())
    assert [r["model"] for r in saved["rows"]][-1] == "FM"


def test_the_truth_is_read_by_the_evaluation_alone(tiny_lake, trained, tmp_path):
    """Training gives the same models with the truth table gone; the evaluation then finds no truth.
    With it, no model beats the Bayes NE beyond noise, and every interval holds its point."""
    import shutil

    from experiments import truth

    first = trained
    known = truth.read_truth(tiny_lake.lake.tables_path, "synthetic")
    assert known is not None and len(known) > 0 and known["p_click"].between(0, 1).all()
    gap = truth.bayes_gap(first["predictions"], known, [r["model"] for r in first["rows"]], resamples=200)
    lo, hi = gap["bayes_ne_ci"]
    assert lo <= gap["bayes_ne"] <= hi
    assert truth.below_bayes(gap, tolerance=hi - lo) == []
    for name, r in gap["models"].items():
        if name != "VM":
            assert r["gap_share_ci"][0] <= r["gap_share"] <= r["gap_share_ci"][1]
    assert "share of the VM-to-Bayes gap" in truth.to_markdown(gap)

    moved = tmp_path / "truth"
    shutil.move(tiny_lake.lake.table_path("truth"), moved)
    try:
        assert truth.read_truth(tiny_lake.lake.tables_path, "synthetic") is None
        second = training.train_all(tiny_lake, "synthetic", TINY, log=lambda *_: None)
    finally:
        shutil.move(moved, tiny_lake.lake.table_path("truth"))
    assert [(r["model"], r["ne"], r["auc"]) for r in second["rows"]] == [(r["model"], r["ne"], r["auc"]) for r in first["rows"]]


def test_truth_rows_must_cover_every_evaluated_row():
    import pandas as pd

    from experiments import truth

    pred = pd.DataFrame({"request_id": ["r1", "r1"], "item_id": ["a", "b"], "label": [1, 0], "VM": [0.5, 0.5]})
    with pytest.raises(ValueError, match="1 of 2 evaluated rows have no truth"):
        truth.bayes_gap(pred, pd.DataFrame({"request_id": ["r1"], "item_id": ["a"], "p_click": [0.4]}), ["VM"])
