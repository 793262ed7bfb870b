"""Promotion gate: a newly trained version becomes the promoted one only if it is not worse than
the promoted version on its own held-out split.

The rule is per model: lower NE for the FM and the VMs, lower reconstruction MSE for the
autoencoder, within ``tolerance`` (0.0: not worse at all; 0.01: up to 1% worse). The first version
of a model is promoted. Each decision is returned (and logged by the caller) with both values.
Jobs that should only run promoted models set ``[models] vm_version = "promoted"`` (and the
same for fm_version, ae_version).

A consumer trained on what the lookup served (``vm_<name>_solaris``, model/served_training.py)
must also not be worse than the plain VM trained on the same served rows; a promoted version
trained on other rows (oracle codes, before served training) is replaced by the first served one.

Note the comparison is between each version's own test split: when the data window moves, the
two numbers come from different days.
"""

from __future__ import annotations

from pathlib import Path

from model import registry

METRIC = {"autoencoder": "reconstruction_mse"}  # everything else: "ne"; lower is better for both
SERVED = "request_features"  # model.served_training.TRAINED_ON: a consumer trained on what was served


def _trained_on(path) -> str:
    """What a version learned from (its window.json's ``trained_on``): every model but a served
    consumer learned from the request log (a ``vm_<name>_solaris`` from before served training,
    from the log with oracle codes)."""
    try:
        return registry.read_json(path, "window.json").get("trained_on") or "the request log"
    except (OSError, ValueError):
        return "the request log"


def _beats_plain_vm(m: dict, tolerance: float) -> bool:
    """A served VM's test NE against the plain VM trained on the same served rows (its metrics
    ``m`` carry both): not worse beyond ``tolerance``."""
    ne, ne_vm = m.get("ne"), m.get("ne_vm")
    return ne is not None and ne_vm is not None and ne == ne and ne_vm == ne_vm and ne <= ne_vm * (1 + tolerance)


def gate(root: Path, saved: dict[str, str], tolerance: float = 0.0) -> list[dict]:
    decisions = []
    for name, path in saved.items():
        metric = METRIC.get(name, "ne")
        new_metrics = registry.read_json(path, "metrics.json")
        new = new_metrics.get(metric)
        try:
            current = registry.resolve(root, name, "promoted")
            old = registry.read_json(current, "metrics.json").get(metric)
        except FileNotFoundError:
            current, old = None, None
        trained_on = _trained_on(path)
        promoted_on = _trained_on(current) if current is not None else None
        if new is None or new != new:  # a missing or NaN metric never promotes
            promote, why = False, f"new {metric} is missing or NaN"
        elif trained_on == SERVED and not _beats_plain_vm(new_metrics, tolerance):
            promote, why = False, (f"ne {new:.5f} is worse than the plain VM's {new_metrics.get('ne_vm', float('nan')):.5f} on the "
                                   f"same served rows (tolerance {tolerance:.1%}): the plain VM keeps serving")
        elif current is not None and promoted_on != trained_on:
            promote, why = True, (f"the promoted version was trained on {promoted_on}, this one on "
                                  f"{trained_on}: their {metric}s are of other rows")
        elif old is None or old != old:
            promote, why = True, "nothing promoted yet" if current is None else f"promoted {metric} is missing"
        else:
            promote = new <= old * (1 + tolerance)
            why = f"{metric} {new:.5f} vs promoted {old:.5f} (tolerance {tolerance:.1%})"
        if promote:
            registry.promote(root, name, Path(path).name)
        decisions.append({"model": name, "version": Path(path).name, "promoted": promote,
                          "previous": current.name if current else None, "reason": why})
    return decisions
