"""The promotion gate: not worse than the promoted version; a consumer trained on what was served
not worse than the plain VM on the same rows; a version trained on other rows is not compared."""

import pytest

from model import promotion, registry
from model.vm import VerticalModel, VMConfig



def save(root, name, ne, ne_vm=None, trained_on=None):
    metrics = {"ne": ne} | ({"ne_vm": ne_vm} if ne_vm is not None else {})
    window = {"trained_on": trained_on} if trained_on else {}
    model = VerticalModel(VMConfig(n_users=3, n_items=3, n_devices=2, n_surfaces=2))
    return str(registry.save(root, name, model, metrics, window))


def decide(root, name, path, tolerance=0.0):
    (d,) = promotion.gate(root, {name: path}, tolerance)
    return d


def test_a_model_is_promoted_only_when_not_worse_than_the_promoted_one(tmp_path):
    first = decide(tmp_path, "vm_click", save(tmp_path, "vm_click", 0.90))
    assert first["promoted"] and first["reason"] == "nothing promoted yet"
    worse = decide(tmp_path, "vm_click", save(tmp_path, "vm_click", 0.91))
    assert not worse["promoted"] and worse["previous"] == "v0001"
    assert (tmp_path / "vm_click" / "PROMOTED").read_text() == "v0001"
    assert decide(tmp_path, "vm_click", save(tmp_path, "vm_click", 0.91), tolerance=0.02)["promoted"]
    assert (tmp_path / "vm_click" / "PROMOTED").read_text() == "v0003"


def test_a_served_consumer_worse_than_the_plain_vm_on_its_rows_is_never_promoted(tmp_path):
    name = "vm_click_solaris"
    worse = decide(tmp_path, name, save(tmp_path, name, 0.95, ne_vm=0.94, trained_on=promotion.SERVED))
    assert not worse["promoted"] and "worse than the plain VM's 0.94000 on the same served rows" in worse["reason"]
    assert not (tmp_path / name / "PROMOTED").exists()  # nothing promoted: the plain VM keeps serving
    better = decide(tmp_path, name, save(tmp_path, name, 0.93, ne_vm=0.94, trained_on=promotion.SERVED))
    assert better["promoted"] and better["reason"] == "nothing promoted yet"
    # not worse than the plain VM, but worse than the promoted served VM: the usual rule holds too
    assert not decide(tmp_path, name, save(tmp_path, name, 0.935, ne_vm=0.94, trained_on=promotion.SERVED))["promoted"]
    # a served VM whose metrics lack the plain VM's NE cannot show it is not worse
    assert not decide(tmp_path, name, save(tmp_path, name, 0.80, trained_on=promotion.SERVED))["promoted"]


def test_a_version_trained_on_oracle_codes_is_replaced_by_the_first_served_one(tmp_path):
    name = "vm_click_solaris"
    decide(tmp_path, name, save(tmp_path, name, 0.70))  # an oracle-trained consumer of an older release
    served = decide(tmp_path, name, save(tmp_path, name, 0.93, ne_vm=0.94, trained_on=promotion.SERVED))
    assert served["promoted"] and served["previous"] == "v0001"
    assert "trained on the request log, this one on request_features" in served["reason"]


def test_consumers_wait_for_a_promoted_model_set_with_a_clear_reason(tmp_path):
    """``fm_version = "promoted"`` on a registry where nothing was promoted yet (the first daily
    run trains, then promotes): the consumers' served training says so instead of failing the DAG."""
    from include.config import SolarisConfig
    from model import served_training, training

    cfg = SolarisConfig().with_overrides(models={"root": str(tmp_path), "fm_version": "promoted",
                                                 "ae_version": "promoted"})
    registry.save(tmp_path, "vm_click", VerticalModel(VMConfig(n_users=3, n_items=3, n_devices=3, n_surfaces=3)), {}, {})
    out = served_training.train_consumers(cfg, training.TINY, log=lambda *_: None)
    assert out["models"] == {} and [d["trained"] for d in out["decisions"]] == [False]
    assert "no promoted version of model 'fm'" in out["decisions"][0]["reason"]
