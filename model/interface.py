"""What a foundation model (FM) or vertical model (VM) must offer for SOLARIS to train, precompute
and serve with it, and how the config names one.

A model is an ``nn.Module`` class named in config by its import path (``[models] fm_class``,
``[[models.consumers]] class``). It has:

- ``config_class``: a dataclass whose fields rebuild the module (``Model(config)``); the registry
  stores it beside the weights and checks it on every load;
- ``inputs`` (an FM only): the input groups it reads, a subset of ``INPUT_GROUPS``. The jobs build
  only those, from the lake, with the same functions for training and inference:

  - ``context``: ``user``, ``item``, ``hour``, ``device``, ``surface`` (every model reads these);
  - ``attributes``: ``category``, ``subcategory`` of the candidate item;
  - ``counters``: ``counters`` (N, len(model.features.COUNTERS)): item and user click counts;
  - ``history``: ``hist``, ``hist_cat``, ``hist_age`` (R, history_len), one row per request, with
    ``req`` (N,) mapping each candidate to its request's row.

An FM's config has ``history_len``, ``horizon_hours`` (how far back history and counters reach)
and ``embedding_dim``; the FM has ``forward(batch) -> (N,) click logits``, ``embed(batch) -> (N,
embedding_dim)`` (the interaction embedding precompute stores, compressed), and ``user_vector(batch)
-> (R, U)`` (the user-only pass the neighbor fallback searches; its batch holds ``user`` and, if the
FM reads history, the history arrays). A VM's config has ``use_fm_embedding`` and ``fm_dim``; its
``forward(batch)`` reads the context, ``position`` when present, and with ``use_fm_embedding`` also
``fm`` (N, fm_dim) and ``tier`` (N,) (model.tiers).

Training builds a model from the data's sizes and the model set's widths (``build``): every field
of ``config_class`` that SOLARIS knows a value for (``SIZE_FIELDS``) is filled, the config's
``*_params`` table overrides or adds the rest, and a field left without a value is a clear error.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

INPUT_GROUPS = frozenset({"context", "attributes", "counters", "history"})
BUILTIN_FM = "model.fm.FoundationModel"
BUILTIN_VM = "model.vm.VerticalModel"
FM_CONFIG_FIELDS = ("history_len", "horizon_hours", "embedding_dim")
VM_CONFIG_FIELDS = ("use_fm_embedding", "fm_dim")
# Values SOLARIS can give a model's config: vocabulary sizes, the model set's widths, the FM's code size.
SIZE_FIELDS = ("n_users", "n_items", "n_devices", "n_surfaces", "n_categories", "n_subcategories", "history_len",
               "horizon_hours", "dim", "layers", "trunk", "embedding_dim", "use_fm_embedding", "fm_dim",
               "hour_encoding", "id_dropout")


class ModelInterfaceError(TypeError):
    """A class named in config that is not usable as an FM or VM, or not allowed to load."""


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"  # as the registry stores it


def import_class(path: str, allowed) -> type:
    """The class at ``path`` ("package.module.Class"), only if ``allowed`` names it. Nothing is
    imported for a path the config does not allow: a checkpoint cannot make SOLARIS run code."""
    if path not in set(allowed):
        raise ModelInterfaceError(f"model class {path!r} is not allowed by the config; allowed: {', '.join(sorted(allowed))}")
    module, _, name = path.rpartition(".")
    if not module:
        raise ModelInterfaceError(f"model class {path!r} is not a 'package.module.Class' path")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ModelInterfaceError(f"model class {path!r} cannot be imported: {type(e).__name__}: {e}") from e
    if not isinstance(cls, type):
        raise ModelInterfaceError(f"{path!r} is a {type(cls).__name__}, not a class")
    return cls


def _check_common(cls: type, kind: str, fields_needed: tuple[str, ...], methods: tuple[str, ...]) -> None:
    from torch import nn

    where = class_path(cls)
    if not issubclass(cls, nn.Module):
        raise ModelInterfaceError(f"{kind} {where} is not a torch.nn.Module")
    cfg = getattr(cls, "config_class", None)
    if not (isinstance(cfg, type) and dataclasses.is_dataclass(cfg)):
        raise ModelInterfaceError(f"{kind} {where} has no config_class dataclass")
    missing = [f for f in fields_needed if f not in {x.name for x in dataclasses.fields(cfg)}]
    if missing:
        raise ModelInterfaceError(f"{kind} {where}: {cfg.__name__} lacks the field(s) {', '.join(missing)}")
    lacking = [m for m in methods if not callable(getattr(cls, m, None))]
    if lacking:
        raise ModelInterfaceError(f"{kind} {where} lacks the method(s) {', '.join(lacking)}")


def check_fm(cls: type) -> type:
    _check_common(cls, "FM", FM_CONFIG_FIELDS, ("forward", "embed", "user_vector"))
    inputs = getattr(cls, "inputs", None)
    if not isinstance(inputs, (frozenset, set, tuple)) or "context" not in inputs or not set(inputs) <= INPUT_GROUPS:
        raise ModelInterfaceError(f"FM {class_path(cls)}: inputs must name 'context' and any of "
                                  f"{', '.join(sorted(INPUT_GROUPS - {'context'}))}; got {inputs!r}")
    return cls


def check_vm(cls: type) -> type:
    _check_common(cls, "VM", VM_CONFIG_FIELDS, ("forward",))
    return cls


def fm_class(path: str, allowed) -> type:
    return check_fm(import_class(path, allowed))


def vm_class(path: str, allowed) -> type:
    return check_vm(import_class(path, allowed))


def check_params(cls: type, params: dict[str, Any]) -> type:
    """``cls`` if every name in ``params`` is a field of its config; else a clear error (before any training)."""
    fields = [f.name for f in dataclasses.fields(cls.config_class)]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ModelInterfaceError(f"{class_path(cls)}: unknown parameter(s) {', '.join(unknown)}; "
                                  f"{cls.config_class.__name__} has {', '.join(fields)}")
    return cls


def build(cls: type, sizes: dict[str, Any], params: dict[str, Any]):
    """``cls(config)``: the config from ``sizes`` (only the fields it has) and ``params`` (which must
    all be fields). A field with no default that neither gives is named in the error."""
    check_params(cls, params)
    fields = {f.name: f for f in dataclasses.fields(cls.config_class)}
    values = {k: v for k, v in sizes.items() if k in fields} | dict(params)
    unset = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
             and f.default_factory is dataclasses.MISSING]
    if unset:
        raise ModelInterfaceError(f"{class_path(cls)}: no value for {', '.join(unset)} "
                                  f"(SOLARIS gives {', '.join(SIZE_FIELDS)}; set others in the config's params)")
    return cls(cls.config_class(**values))
