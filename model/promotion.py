"""Promotion gate: a newly trained version becomes the promoted one only if it is not worse than
the promoted version on its own held-out split.

The rule is per model: lower NE for the FM and the VMs, lower reconstruction MSE for the
autoencoder, within ``tolerance`` (0.0: not worse at all; 0.01: up to 1% worse). The first version
of a model is promoted. Each decision is returned (and logged by the caller) with both values.
Jobs that should only run promoted models set ``[models] vm_version = "promoted"`` (and the
same for fm_version, ae_version).

Note the comparison is between each version's own test split: when the data window moves, the
two numbers come from different days.
"""

from __future__ import annotations

from pathlib import Path

from model import registry

METRIC = {"autoencoder": "reconstruction_mse"}  # everything else: "ne"; lower is better for both


def gate(root: Path, saved: dict[str, str], tolerance: float = 0.0) -> list[dict]:
    decisions = []
    for name, path in saved.items():
        metric = METRIC.get(name, "ne")
        new = registry.read_json(path, "metrics.json").get(metric)
        try:
            current = registry.resolve(root, name, "promoted")
            old = registry.read_json(current, "metrics.json").get(metric)
        except FileNotFoundError:
            current, old = None, None
        if new is None or new != new:  # a missing or NaN metric never promotes
            promote, why = False, f"new {metric} is missing or NaN"
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
