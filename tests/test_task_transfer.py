"""The click FM's embedding fed to a conversion VM (experiments/task_transfer.py) on the shared tiny log."""

import json
import os

import pytest

from model import data as mdata

from tests.conftest import TINY, copy_lake

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tiny_lake(spark, lake_root, base_lake):
    from tests.conftest import _test_config

    return copy_lake(spark, base_lake, _test_config(lake_root / "task_transfer", database="t_task_transfer"), models=False)


def test_the_conversion_task_reads_conversions_and_compares_every_variant(tiny_lake):
    from experiments import task_transfer

    result = task_transfer.run(tiny_lake, "synthetic", TINY, log=lambda *_: None)
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == task_transfer.ORDER
    # The labels of the conversion task are the logged conversions of the test rows, not the clicks.
    logged = mdata.read_table(tiny_lake, "request_log", ["request_id", "item_id", "label", "conversion"], "synthetic")
    test = result["predictions"].merge(logged, on=["request_id", "item_id"], suffixes=("", "_logged"), validate="one_to_one")
    assert len(test) == len(result["predictions"]) == result["window"]["test"]["rows"]
    assert (test["label"] == test["conversion"]).all() and 0 < test["label"].sum() < test["label_logged"].sum()
    for r in rows.values():
        assert r["ne_ci"][0] <= r["ne"] <= r["ne_ci"][1] and r["auc_ci"][0] <= r["auc"] <= r["auc_ci"][1]
    assert rows["VM"]["ne_vs_vm_pct"] == 0.0
    assert result["fm_beats_vm"] == (rows["conversion FM"]["ne_vs_vm_pct_ci"][1] < 0)
    md = task_transfer.to_markdown(result)
    line = next(x for x in md.splitlines() if x.startswith(f"| {task_transfer.CLICK_EMBEDDING} |"))
    assert ("n/a: FM not better" in line) == (not result["fm_beats_vm"])


def test_a_log_without_a_conversion_label_is_a_clear_error():
    import pandas as pd

    from experiments import task_transfer

    clicks_only = pd.DataFrame({"request_id": ["r1", "r1"], "item_id": ["a", "b"], "label": [1, 0],
                                "conversion": [None, None]})
    with pytest.raises(ValueError, match="source 'globo' has no conversion label"):
        task_transfer.conversion_task(clicks_only, "globo")
    mixed = clicks_only.assign(conversion=[1, None])
    assert task_transfer.conversion_task(mixed, "x")[["item_id", "label"]].values.tolist() == [["a", 1]]


def test_command_line_writes_the_report_with_the_conversion_bayes_ne(tiny_lake, tmp_path, monkeypatch, capsys):
    from experiments import task_transfer

    monkeypatch.setenv("SOLARIS_LAKE_ROOT", str(tiny_lake.lake.root_path))
    assert task_transfer.main(["--source", "synthetic", "--skip-ingest", "--models", "quick", "--reports", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Bayes NE (predicting the true conversion probability)" in out
    saved = json.loads((tmp_path / "task_transfer_synthetic.json").read_text())
    assert [r["model"] for r in saved["rows"]] == task_transfer.ORDER
    assert saved["bayes"]["label"] == "conversion" and set(saved["bayes"]["models"]) == set(task_transfer.ORDER)
    assert os.path.exists(tmp_path / "task_transfer_synthetic.md")
