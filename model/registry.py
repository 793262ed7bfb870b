"""A small model registry: one folder per model and version.

    <root>/<name>/v0003/weights.pt     state dict
                        config.json    the config dataclass that rebuilds the module, and its class
                        metrics.json   evaluation numbers
                        window.json    the training data window (time range, source, row counts)
                        <extras>       e.g. vocab.json
    <root>/<name>/PROMOTED             the version serving traffic (written by ``promote``)

Loading checks the stored config against the code's config class: a checkpoint written by
different code is a clear ``CheckpointMismatch``, never a half-loaded model. (A config field added
to the code since, with a default, takes that default; the weights must still fit.) ``load_declared``
loads a version of any FM or VM class (model/interface.py), but only of a class the config names.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where weights are read or written: the lookup service resolves
    from torch import nn  # model versions and sizes without paying for it


class CheckpointMismatch(RuntimeError):
    """A checkpoint that does not match the model code asked to load it."""


def _versions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("v[0-9][0-9][0-9][0-9]") if (p / "weights.pt").exists())


def save(root: Path, name: str, model: nn.Module, metrics: dict[str, Any], window: dict[str, Any],
         extras: dict[str, str] | None = None) -> Path:
    """Write a new version of ``name``; returns its folder. Written to a temp folder and renamed,
    so a crash never leaves a half-written version that loaders would pick up."""
    import torch

    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    existing = _versions(folder)
    version = f"v{int(existing[-1][1:]) + 1 if existing else 1:04d}"
    tmp = folder / f".{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    cfg = model.cfg
    torch.save(model.state_dict(), tmp / "weights.pt")
    (tmp / "config.json").write_text(json.dumps(
        {"class": f"{type(model).__module__}.{type(model).__name__}",
         "config_class": f"{type(cfg).__module__}.{type(cfg).__name__}",
         "config": dataclasses.asdict(cfg)}, indent=1))
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1, default=float))
    (tmp / "window.json").write_text(json.dumps(window, indent=1, default=str))
    for fname, text in (extras or {}).items():
        (tmp / fname).write_text(text)
    tmp.rename(folder / version)
    return folder / version


def resolve(root: Path, name: str, version: str = "latest") -> Path:
    folder = Path(root) / name
    if version == "promoted":
        marker = folder / "PROMOTED"
        if not marker.exists():
            raise FileNotFoundError(f"no promoted version of model {name!r} under {folder}")
        version = marker.read_text().strip()
    if version == "latest":
        found = _versions(folder)
        if not found:
            raise FileNotFoundError(f"no saved versions of model {name!r} under {folder}")
        version = found[-1]
    if not re.fullmatch(r"v\d{4}", version) or not (folder / version / "weights.pt").exists():
        raise FileNotFoundError(f"model {name!r} has no version {version!r} under {folder}")
    return folder / version


def load(path: Path, module_cls: type[nn.Module], config_cls: type, map_location: str = "cpu") -> nn.Module:
    """Rebuild and load a module; raise ``CheckpointMismatch`` if the stored config or weights do not
    fit, whatever is wrong with them. The module is first built on torch's ``meta`` device (shapes
    without memory) and its shapes compared with the stored weights', so a stored config that asks
    for a huge model fails before anything is allocated."""
    import torch

    path = Path(path)
    try:
        meta = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointMismatch(f"{path}: unreadable config.json ({e})") from e
    expected = f"{module_cls.__module__}.{module_cls.__name__}"
    held = meta.get("class") if isinstance(meta, dict) else f"config of type {type(meta).__name__}"
    if held != expected:
        raise CheckpointMismatch(f"{path} holds a {held}, not a {expected}")
    stored_cfg = meta.get("config")
    if not isinstance(stored_cfg, dict):
        raise CheckpointMismatch(f"{path}: config.json has no config object")
    # A field added to the config class since the checkpoint was written takes its default (the
    # weights' shapes are still checked below); a field the code no longer has is a mismatch.
    added = {f.name: f.default for f in dataclasses.fields(config_cls)
             if f.default is not dataclasses.MISSING and f.name not in stored_cfg}
    stored_cfg = {**added, **stored_cfg}
    fields = {f.name for f in dataclasses.fields(config_cls)}
    stored = set(stored_cfg)
    if stored != fields:
        raise CheckpointMismatch(
            f"{path}: config fields differ from {config_cls.__name__} in this code: "
            f"only in checkpoint {sorted(stored - fields)}, only in code {sorted(fields - stored)}")
    try:
        cfg = config_cls(**stored_cfg)
        with torch.device("meta"):
            skeleton = module_cls(cfg)
    except Exception as e:  # a value the module cannot be built from (a negative size, a string, ...)
        raise CheckpointMismatch(f"{path}: stored config does not build a {module_cls.__name__}: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    try:
        state = torch.load(path / "weights.pt", map_location=map_location, weights_only=True, mmap=True)
    except Exception as e:  # missing, truncated, not a checkpoint, or objects a safe load refuses
        raise CheckpointMismatch(f"{path}: weights do not fit {module_cls.__name__}: unreadable weights.pt "
                                 f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()} if isinstance(state, dict) and all(
        isinstance(v, torch.Tensor) for v in state.values()) else None
    if got != want:
        diff = ("not a state dict" if got is None else
                "; ".join(f"{k}: stored {got.get(k)}, config gives {want.get(k)}"
                          for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))[:500])
        raise CheckpointMismatch(f"{path}: weights do not fit {module_cls.__name__}: {diff}")
    hollow = unbacked_tensors(state)
    if hollow:
        raise CheckpointMismatch(f"{path}: weights do not fit {module_cls.__name__}: tensors not backed by stored "
                                 f"data (a forged or corrupt weights.pt): {', '.join(hollow[:5])}")
    model = module_cls(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


def unbacked_tensors(state: dict) -> list[str]:
    """Names of the tensors of ``state`` whose shape claims more elements than their storage holds
    (a stride of 0 repeats one stored value over a shape of any size), each with its shape and
    stride. The loader copies every tensor into a module allocated from the config's sizes, so a
    69 KB file of such tensors would make it allocate gigabytes: they are refused before any
    allocation. Tensors sharing one storage (tied weights) are backed and pass."""
    out = []
    for name, t in state.items():
        need = (t.storage_offset() + t.numel()) * t.element_size()
        if not t.is_contiguous() or t.untyped_storage().nbytes() < need:
            out.append(f"{name} (shape {tuple(t.shape)}, stride {t.stride()}, "
                       f"{t.untyped_storage().nbytes()} stored bytes)")
    return out


def stored_class(path: Path) -> str:
    """The import path of the class a version holds, as written by ``save``."""
    try:
        meta = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointMismatch(f"{path}: unreadable config.json ({e})") from e
    held = meta.get("class") if isinstance(meta, dict) else None
    if not isinstance(held, str):
        raise CheckpointMismatch(f"{path}: config.json names no class")
    return held


def load_declared(path: Path, kind: str, allowed, map_location: str = "cpu") -> nn.Module:
    """Load a version whose class the config allows (``kind``: "fm" or "vm", checked against
    ``model.interface``). The class is imported only after the allow-list admits it, and the
    weights load as tensors only (no pickled objects run)."""
    from model import interface

    cls = (interface.fm_class if kind == "fm" else interface.vm_class)(stored_class(path), allowed)
    held_cfg = json.loads((Path(path) / "config.json").read_text()).get("config_class")
    if held_cfg != interface.class_path(cls.config_class):
        raise CheckpointMismatch(f"{path}: config class {held_cfg} is not {interface.class_path(cls)}'s "
                                 f"{interface.class_path(cls.config_class)}")
    return load(path, cls, cls.config_class, map_location)


def read_json(path: Path, fname: str) -> dict:
    return json.loads((Path(path) / fname).read_text())


def promote(root: Path, name: str, version: str) -> None:
    path = resolve(root, name, version)
    marker = Path(root) / name / "PROMOTED"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(path.name)
    tmp.replace(marker)  # atomic: readers see the old or the new version, never neither


def consumer_name(consumer: str, variant: str = "") -> str:
    """The registry name of a consumer VM (``[[models.consumers]]`` name) and its variant: ``vm_click``,
    ``vm_click_kd``, ``vm_click_solaris``."""
    return f"vm_{consumer}" + (f"_{variant}" if variant else "")


def weights_digest(version_folder: str | Path) -> str:
    """The SHA-256 of a version's weights: what identifies the model behind a derived result, even
    where a folder was reused for another training run."""
    path = Path(version_folder) / "weights.pt"
    st = path.stat()
    return _digest(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _digest(path: str, *file_stamp) -> str:
    """Cached by the file's size, times and inode (a rewritten file is read again): each hourly job
    asks for the same few versions' digests."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version(models: dict[str, str]) -> str:
    """The code space of the embeddings that an FM and autoencoder write: both version folders and
    their weights' digests, e.g. ``fm/v0003@1a2b3c4d5e6f+autoencoder/v0002@0f9e8d7c6b5a``. Codes of
    two code spaces are never served, averaged or compared together; a consumer VM reads only the
    code space it was trained on. The digest tells apart a folder reused for another training run."""
    fm, ae = Path(models["fm"]), Path(models["autoencoder"])
    return f"fm/{fm.name}@{weights_digest(fm)[:12]}+autoencoder/{ae.name}@{weights_digest(ae)[:12]}"


CODE_VERSION = re.compile(r"fm/(v\d{4})@([0-9a-f]{12})\+autoencoder/(v\d{4})@([0-9a-f]{12})")


def code_space_models(root: Path, version: str) -> dict[str, str]:
    """The FM and autoencoder folders that write the code space ``version``. ``FileNotFoundError``
    when either is gone or its weights are no longer those the space was named after."""
    m = CODE_VERSION.fullmatch(version or "")
    if m is None:
        raise ValueError(f"{version!r} is not a code version (fm/vNNNN@digest+autoencoder/vNNNN@digest)")
    models = {"fm": str(resolve(root, "fm", m[1])), "autoencoder": str(resolve(root, "autoencoder", m[3]))}
    if code_version(models) != version:
        raise FileNotFoundError(f"the registry's {m[1]} / {m[3]} hold other weights than code space {version}")
    return models


@dataclasses.dataclass(frozen=True)
class CodeSpaces:
    """Which code spaces the hourly cycle writes and which it serves.

    ``newest`` is the code space of the FM and autoencoder the config names (``fm_version``,
    ``ae_version``); ``serving`` the one the consumers read: the code space the verifier consumer's
    promoted SOLARIS VM was trained on (``newest`` while there is none). While they differ a
    rollout is under way: precompute writes both (``models``; the consumers' for at most ``[models]
    rollout_overlap_hours``), publications serve ``serving`` and resolve ``newest`` in shadow, the
    daily DAG trains the consumers on the shadow rows, and the first publication after their
    promotion serves ``newest``: one switch, never a mix."""

    serving: str
    newest: str
    models: dict[str, dict[str, str]]  # code space -> {"fm", "autoencoder"} folders, for each one that can be written
    reason: str

    @property
    def rollout(self) -> bool:
        return self.serving != self.newest

    @property
    def shadow(self) -> str | None:
        """The code space resolved beside the served one for the consumers' next training (None: none)."""
        return self.newest if self.rollout else None


def code_spaces(cfg) -> CodeSpaces:
    """The code spaces of the config's models and of its consumers (``CodeSpaces``)."""
    models = resolve_models(cfg)
    newest = code_version(models)
    only_newest = {newest: {"fm": models["fm"], "autoencoder": models["autoencoder"]}}
    if not cfg.models.rollout:
        return CodeSpaces(newest, newest, only_newest, "the models the config names ([models] rollout = false)")
    try:
        serving = consumer_code_version(cfg.models_root, cfg.models.verifier)
    except LookupError as e:
        return CodeSpaces(newest, newest, only_newest, f"the newest code space ({e})")
    if serving == newest:
        return CodeSpaces(newest, newest, only_newest, "the consumers read the newest code space")
    try:
        old = code_space_models(cfg.models_root, serving)
        sizes = {autoencoder_code_dim(m["autoencoder"]) for m in (old, models)}
        if len(sizes) > 1:  # one lookup answers one code size: such a change is a new deployment
            raise ValueError(f"its codes are of another size than the newest autoencoder's ({sorted(sizes)})")
    except (FileNotFoundError, ValueError) as e:
        return CodeSpaces(serving, newest, only_newest, f"rollout: the consumers' code space can no longer be "
                                                         f"written ({e}); its rows expire")
    return CodeSpaces(serving, newest, {**only_newest, serving: old},
                      "rollout: the consumers' code space is served until consumers of the newest one are promoted")


def consumer_code_version(root: Path, consumer: str) -> str:
    """The code space the promoted SOLARIS VM of ``consumer`` was trained on (its ``window.json``):
    what the lookup may serve it. ``LookupError`` with the reason when there is none to tell."""
    name = consumer_name(consumer, "solaris")
    try:
        window = read_json(resolve(root, name, "promoted"), "window.json")
    except FileNotFoundError as e:
        raise LookupError(f"consumer {consumer!r} has no promoted SOLARIS VM ({name}) under {root}: {e}") from e
    version = window.get("code_version")
    if not version:
        raise LookupError(f"consumer {consumer!r}: its promoted {name} records no code_version (trained before "
                          "code spaces were recorded); name the code_version in the request or retrain it")
    return version


def resolve_models(cfg) -> dict[str, str]:
    """The model set a job runs, from the config's ``[models]`` section: {"vm" (the verifier: the
    plain VM of the consumer ``[models] verifier`` names), "fm", "autoencoder"} -> version folder.
    Fails with ``FileNotFoundError`` before any work if one is missing."""
    m, root = cfg.models, cfg.models_root
    return {"vm": str(resolve(root, consumer_name(m.verifier), m.vm_version)),
            "fm": str(resolve(root, "fm", m.fm_version)),
            "autoencoder": str(resolve(root, "autoencoder", m.ae_version))}


def code_dim(cfg) -> int:
    """The stored embedding size: the configured autoencoder's code size."""
    return autoencoder_code_dim(resolve_models(cfg)["autoencoder"])


def autoencoder_code_dim(version_folder: str | Path) -> int:
    """The code size of an autoencoder version: the embedding size of its code space."""
    return int(read_json(version_folder, "config.json")["config"]["code_dim"])

