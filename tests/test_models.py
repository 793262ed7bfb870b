"""The FM, autoencoder and VM modules, the registry, and a tiny end-to-end training run."""

import json
import re

import numpy as np
import pytest
import torch

from model import registry
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import COUNTERS
from model.fm import FMConfig, FoundationModel
from model.train import flops_per_example, infer, pick_device
from model.vm import TIERS, VerticalModel, VMConfig

SIZES = dict(n_users=50, n_items=80, n_devices=4, n_surfaces=4)


def batch(n=8, history_len=50, seed=0, empty_history=False, requests=3):
    """``n`` candidate rows of ``requests`` requests (a history row per request)."""
    rng = np.random.default_rng(seed)
    hist = rng.integers(2, 80, (requests, history_len))
    if empty_history:
        hist[:] = 0
    return {"req": np.sort(rng.integers(0, requests, n)), "hist": hist, "hist_cat": np.where(hist > 0, 1, 0),
            "hist_age": np.where(hist > 0, rng.integers(1, 16, hist.shape), 0),
            "user": rng.integers(0, 50, n), "item": rng.integers(2, 80, n),
            "hour": rng.integers(0, 24, n), "device": rng.integers(0, 4, n), "surface": rng.integers(0, 4, n),
            "category": np.zeros(n, dtype=np.int64), "subcategory": np.zeros(n, dtype=np.int64),
            "counters": rng.normal(size=(n, len(COUNTERS))).astype(np.float32),
            "position": rng.integers(0, 5, n), "label": rng.integers(0, 2, n).astype(np.float32),
            "fm": rng.normal(size=(n, 32)).astype(np.float32), "tier": rng.integers(0, len(TIERS), n)}


def test_fm_embeds_pairs_and_handles_users_without_history():
    fm = FoundationModel(FMConfig(**SIZES)).eval()
    for b in (batch(), batch(empty_history=True)):
        emb = infer(fm.embed, fm, b)
        logits = infer(fm, fm, b)
        assert emb.shape == (8, 256) and logits.shape == (8,)
        assert np.isfinite(emb).all() and np.isfinite(logits).all()


def test_fm_is_at_least_20x_the_vm_in_flops_per_pair():
    fm = FoundationModel(FMConfig(**SIZES))
    vm = VerticalModel(VMConfig(**SIZES, use_fm_embedding=True))
    b = batch(16)
    ratio = flops_per_example(fm, fm, b) / flops_per_example(vm, vm, b)
    assert ratio >= 20, ratio


def test_vm_rejects_an_embedding_of_the_wrong_dimension():
    vm = VerticalModel(VMConfig(**SIZES, use_fm_embedding=True, fm_dim=16))
    with pytest.raises(ValueError, match="dimension 32, the VM expects 16"):
        infer(vm, vm, batch())


def test_inference_refuses_nan_inputs():
    vm = VerticalModel(VMConfig(**SIZES, use_fm_embedding=True))
    b = batch()
    b["fm"][3, 5] = np.nan
    with pytest.raises(ValueError, match="input 'fm' has 1 NaN or infinite values"):
        infer(vm, vm, b)


def test_cuda_requested_without_a_gpu_is_an_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        pick_device("cuda")
    assert pick_device("auto").type == "cpu"


def test_registry_round_trip_and_versions(tmp_path):
    ae = EmbeddingAutoencoder(AEConfig(input_dim=24, code_dim=4))
    p1 = registry.save(tmp_path, "ae", ae, {"mse": 0.5}, {"from": "a"})
    p2 = registry.save(tmp_path, "ae", ae, {"mse": 0.4}, {"from": "b"})
    assert (p1.name, p2.name) == ("v0001", "v0002")
    assert registry.resolve(tmp_path, "ae") == p2
    loaded = registry.load(p1, EmbeddingAutoencoder, AEConfig)
    x = torch.randn(5, 24)
    with torch.inference_mode():
        assert torch.equal(loaded(x), ae.eval()(x))
    assert registry.read_json(p2, "metrics.json") == {"mse": 0.4}
    with pytest.raises(FileNotFoundError, match="no promoted version"):
        registry.resolve(tmp_path, "ae", "promoted")
    registry.promote(tmp_path, "ae", "v0001")
    assert registry.resolve(tmp_path, "ae", "promoted") == p1


def test_a_code_space_is_named_by_both_versions_and_their_weights(tmp_path):
    """Two trainings that reuse one folder name (a registry rebuilt) are two code spaces."""
    import shutil

    torch.manual_seed(0)
    fm = registry.save(tmp_path, "fm", EmbeddingAutoencoder(AEConfig(input_dim=8, code_dim=4)), {}, {})
    ae = registry.save(tmp_path, "autoencoder", EmbeddingAutoencoder(AEConfig(input_dim=8, code_dim=4)), {}, {})
    version = registry.code_version({"fm": str(fm), "autoencoder": str(ae)})
    assert re.fullmatch(r"fm/v0001@[0-9a-f]{12}\+autoencoder/v0001@[0-9a-f]{12}", version), version
    assert registry.code_version({"fm": str(fm), "autoencoder": str(ae)}) == version  # the same weights, the same space
    shutil.rmtree(ae)
    registry.save(tmp_path, "autoencoder", EmbeddingAutoencoder(AEConfig(input_dim=8, code_dim=4)), {}, {})
    again = registry.code_version({"fm": str(fm), "autoencoder": str(ae)})
    assert again != version and again.split("@")[0] == version.split("@")[0]  # same folder names, other weights


def test_a_config_field_added_since_the_checkpoint_takes_its_default(tmp_path):
    """A VM saved before ``features`` existed loads with every feature; shapes are still checked."""
    vm = VerticalModel(VMConfig(n_users=5, n_items=6, n_devices=3, n_surfaces=3))
    path = registry.save(tmp_path, "vm", vm, {}, {})
    meta = json.loads((path / "config.json").read_text())
    del meta["config"]["features"]
    (path / "config.json").write_text(json.dumps(meta))
    loaded = registry.load(path, VerticalModel, VMConfig)
    assert loaded.features == VMConfig.features and loaded.cfg.n_items == 6
    narrow = VerticalModel(VMConfig(n_users=5, n_items=6, n_devices=3, n_surfaces=3, features=("user", "item")))
    assert not hasattr(narrow, "device") and narrow.mlp[0].in_features == 32
    path = registry.save(tmp_path, "vm", narrow, {}, {})
    assert registry.load(path, VerticalModel, VMConfig).features == ("user", "item")
    meta = json.loads((path / "config.json").read_text())
    del meta["config"]["features"]  # the default (every feature) does not fit these weights
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(registry.CheckpointMismatch, match="weights do not fit"):
        registry.load(path, VerticalModel, VMConfig)
    with pytest.raises(ValueError, match="VM features must be a non-empty subset"):
        VerticalModel(VMConfig(n_users=5, n_items=6, n_devices=3, n_surfaces=3, features=("user", "age")))


def test_registry_rejects_checkpoints_that_do_not_match(tmp_path):
    ae = EmbeddingAutoencoder(AEConfig(input_dim=24, code_dim=4))
    path = registry.save(tmp_path, "ae", ae, {}, {})
    with pytest.raises(registry.CheckpointMismatch, match="holds a model.autoencoder.EmbeddingAutoencoder, not a model.vm.VerticalModel"):
        registry.load(path, VerticalModel, VMConfig)
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["dropout"] = 0.1
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(registry.CheckpointMismatch, match=r"only in checkpoint \['dropout'\]"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)
    del meta["config"]["dropout"]
    meta["config"]["code_dim"] = 8  # config rebuilds a module whose shapes differ from the weights
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(registry.CheckpointMismatch, match="weights do not fit"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)
    (path / "weights.pt").write_bytes(b"not a checkpoint")
    meta["config"]["code_dim"] = 4
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(registry.CheckpointMismatch, match="weights do not fit"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)
    with pytest.raises(FileNotFoundError, match="no version 'v0009'"):
        registry.resolve(tmp_path, "ae", "v0009")


@pytest.mark.parametrize("config, message", [
    ([1, 2], "holds a config of type list"),
    ({"class": "model.autoencoder.EmbeddingAutoencoder"}, "has no config object"),
    ({"class": "model.autoencoder.EmbeddingAutoencoder", "config": {"input_dim": "24", "code_dim": 4, "hidden": 8}},
     "stored config does not build a EmbeddingAutoencoder: TypeError"),
    ({"class": "model.autoencoder.EmbeddingAutoencoder", "config": {"input_dim": -3, "code_dim": 4, "hidden": 8}},
     "stored config does not build a EmbeddingAutoencoder: RuntimeError"),
    # a stored size far beyond the weights: refused before a byte of it is allocated
    ({"class": "model.autoencoder.EmbeddingAutoencoder", "config": {"input_dim": 24, "code_dim": 4, "hidden": 10**12}},
     r"encoder.0.weight: stored \(128, 24\), config gives \(1000000000000, 24\)"),
])
def test_every_bad_stored_config_is_a_checkpoint_mismatch(tmp_path, config, message):
    ae = EmbeddingAutoencoder(AEConfig(input_dim=24, code_dim=4))
    path = registry.save(tmp_path, "ae", ae, {}, {})
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(registry.CheckpointMismatch, match=message):
        registry.load(path, EmbeddingAutoencoder, AEConfig)


def test_weights_that_are_not_a_state_dict_are_a_checkpoint_mismatch(tmp_path):
    ae = EmbeddingAutoencoder(AEConfig(input_dim=24, code_dim=4))
    path = registry.save(tmp_path, "ae", ae, {}, {})
    torch.save({"encoder.0.weight": [1, 2, 3]}, path / "weights.pt")
    with pytest.raises(registry.CheckpointMismatch, match="not a state dict"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)
    (path / "weights.pt").unlink()
    with pytest.raises(registry.CheckpointMismatch, match="unreadable weights.pt"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)


def test_weights_of_repeated_values_are_refused_before_any_allocation(tmp_path):
    """A forged weights.pt of stride-0 tensors: each holds one value but claims the full shape the
    config gives, so a few KB stand for gigabytes; the loader refuses it before building the module."""
    ae = EmbeddingAutoencoder(AEConfig(input_dim=24, code_dim=4))
    path = registry.save(tmp_path, "ae", ae, {}, {})
    forged = {k: torch.zeros(1).expand(*v.shape) if v.dim() else v for k, v in ae.state_dict().items()}
    torch.save(forged, path / "weights.pt")
    with pytest.raises(registry.CheckpointMismatch, match=r"not backed by stored data.*encoder.0.weight \(shape \(128, 24\), stride \(0, 0\)"):
        registry.load(path, EmbeddingAutoencoder, AEConfig)
    torch.save(ae.state_dict(), path / "weights.pt")  # the real weights still load
    assert isinstance(registry.load(path, EmbeddingAutoencoder, AEConfig), EmbeddingAutoencoder)


def _fit_tiny_vm(**cfg):
    """A VM trained a few steps on rows whose hours are 0..11 and whose ids never include the unknown id
    (no weight decay: a row moves only when the data reach it)."""
    from model.train import TrainConfig, bce_loss, fit

    rng = np.random.default_rng(1)
    n = 4000
    rows = {"user": rng.integers(2, 50, n), "item": rng.integers(2, 80, n), "hour": rng.integers(0, 12, n),
            "device": rng.integers(2, 4, n), "surface": rng.integers(2, 4, n), "position": np.zeros(n, np.int64)}
    rows["label"] = (rng.random(n) < 0.2 + 0.3 * (rows["hour"] < 6)).astype(np.float32)
    torch.manual_seed(0)
    vm = VerticalModel(VMConfig(**SIZES, **cfg))
    start = {k: v.detach().clone() for k, v in vm.state_dict().items()}
    fit(vm, bce_loss, rows, rows, TrainConfig(epochs=2, batch_size=256, warmup_steps=1, weight_decay=0.0, device="cpu"), lambda *_: None)
    return vm, start


def test_a_trained_vm_has_no_untrained_row_for_a_new_id_or_an_unseen_hour():
    from model.features import OOV
    from model.vm import TRAINED

    # before: an hour row per hour and no id dropout leave hours 12..23 and the unknown id's rows at
    # their random initialisation, and a test row that reads them gets noise
    old, start = _fit_tiny_vm()
    assert torch.equal(old.hour.weight[12:], start["hour.weight"][12:])
    assert torch.equal(old.item.weight[OOV], start["item.weight"][OOV])
    assert torch.equal(old.user.weight[OOV], start["user.weight"][OOV])
    # SOLARIS's VMs: the hour is a point on a circle read by trained weights, and the unknown id's rows learn
    vm, start = _fit_tiny_vm(**TRAINED)
    assert not hasattr(vm.hour, "num_embeddings") and all(
        not torch.equal(p, start[f"hour.{k}"]) for k, p in vm.hour.named_parameters())
    assert not torch.equal(vm.item.weight[OOV], start["item.weight"][OOV])
    assert not torch.equal(vm.user.weight[OOV], start["user.weight"][OOV])
    # an unseen hour reads between its trained neighbours: 18h is 6h from both 12h and 0h
    vm.eval()
    with torch.inference_mode():
        h = vm._read("hour", torch.tensor([0, 12, 18, 6]))
    assert torch.allclose(h[2], h[0] + h[1] - h[3], atol=1e-5)  # linear in (sin, cos): h(18) + h(6) = h(0) + h(12)
    # id dropout is training only: inference reads the ids as given
    ids = torch.tensor([5, 6, 7])
    assert torch.equal(vm._read("item", ids), vm.item(ids))


def test_a_vm_reading_the_last_click_learns_the_pull_of_the_item_just_clicked():
    """The label follows the item clicked minutes ago (the same visit), which no id or context
    carries: the VM with the session input learns it, the plain VM cannot."""
    from model.metrics import normalized_entropy
    from model.train import TrainConfig, bce_loss, fit, infer, sigmoid

    rng = np.random.default_rng(3)

    def rows(n):
        x = {"user": rng.integers(2, 50, n), "item": rng.integers(2, 30, n), "hour": rng.integers(0, 24, n),
             "device": rng.integers(2, 4, n), "surface": rng.integers(2, 4, n), "position": np.zeros(n, np.int64),
             "last_item": rng.integers(2, 30, n), "last_age": rng.integers(1, 16, n)}
        same = rng.random(n) < 0.4
        x["last_item"] = np.where(same, x["item"], x["last_item"])
        pull = same & (x["last_age"] <= 4)  # clicked minutes ago
        x["label"] = (rng.random(n) < np.where(pull, 0.7, 0.1)).astype(np.float32)
        return x

    train, test = rows(12000), rows(4000)
    ne = {}
    for session in (False, True):
        torch.manual_seed(0)
        vm = VerticalModel(VMConfig(**SIZES, session=session))
        fit(vm, bce_loss, train, test, TrainConfig(epochs=8, batch_size=256, lr=1e-2, device="cpu"), lambda *_: None)
        ne[session] = normalized_entropy(test["label"], sigmoid(infer(vm, vm, test)))
    assert ne[True] < 0.9 * ne[False], ne
    # every unknown item reads one row: a candidate or a last click outside the vocabulary has no pull
    from model.features import OOV

    b = {k: torch.as_tensor(v[:50]) for k, v in test.items()}
    with torch.inference_mode():
        assert (vm.session_pull(b) != 0).all()
        for unknown in ("item", "last_item"):
            assert (vm.session_pull({**b, unknown: torch.full((50,), OOV)}) == 0).all()


def test_vm_config_values_are_checked():
    with pytest.raises(ValueError, match="hour_encoding"):
        VerticalModel(VMConfig(**SIZES, hour_encoding="weekly"))
    with pytest.raises(ValueError, match="id_dropout"):
        VerticalModel(VMConfig(**SIZES, id_dropout=1.0))


def test_code_spaces_follow_the_consumers_through_a_rollout(tmp_path):
    """No SOLARIS consumer yet: the newest space is served. A consumer trained on space A keeps A
    served when a new FM arrives, with both written and the new one in shadow; its promotion on the
    new space ends the rollout. A consumers' space that cannot be written (another code size) is
    still served, but only the newest is written."""
    from include.config import SolarisConfig

    torch.manual_seed(0)
    cfg = SolarisConfig().with_overrides(models={"root": str(tmp_path)})

    def save(name, code_dim=4, window=None):
        return registry.save(tmp_path, name, EmbeddingAutoencoder(AEConfig(input_dim=8, code_dim=code_dim)), {},
                             window or {})

    save("vm_click"), save("fm"), save("autoencoder")
    a = registry.code_version(registry.resolve_models(cfg))
    spaces = registry.code_spaces(cfg)
    assert (spaces.serving, spaces.newest, list(spaces.models), spaces.shadow) == (a, a, [a], None)
    assert "no promoted SOLARIS VM" in spaces.reason

    registry.promote(tmp_path, "vm_click_solaris", save("vm_click_solaris", window={"code_version": a}).name)
    assert registry.code_spaces(cfg).serving == a and not registry.code_spaces(cfg).rollout
    save("fm")  # the daily DAG trains a new FM: a new code space, rolled out in shadow
    b = registry.code_version(registry.resolve_models(cfg))
    spaces = registry.code_spaces(cfg)
    assert b != a and (spaces.serving, spaces.newest, spaces.shadow) == (a, b, b)
    assert spaces.models[a] == {"fm": str(tmp_path / "fm" / "v0001"), "autoencoder": str(tmp_path / "autoencoder" / "v0001")}
    assert set(spaces.models) == {a, b}

    registry.promote(tmp_path, "vm_click_solaris", save("vm_click_solaris", window={"code_version": b}).name)
    spaces = registry.code_spaces(cfg)
    assert (spaces.serving, spaces.newest, list(spaces.models), spaces.rollout) == (b, b, [b], False)

    save("autoencoder", code_dim=6)  # another code size: no shadow, the consumers' space only expires
    spaces = registry.code_spaces(cfg)
    assert spaces.serving == b and spaces.newest != b and list(spaces.models) == [spaces.newest]
    assert "another size" in spaces.reason
    with pytest.raises(LookupError, match="'ads' has no promoted SOLARIS VM"):
        registry.consumer_code_version(tmp_path, "ads")
    with pytest.raises(FileNotFoundError, match="hold other weights"):
        registry.code_space_models(tmp_path, a.replace(a.split("@")[1][:12], "0" * 12))
