"""Consumer VMs trained on what the lookup served: the daily form of the replay's served variant.

A production VM learns from the features it was served, as logged: ``request_features`` (the tier
and embedding each candidate was served at its request time) labelled from ``request_log``. The
oracle variant that ``model.training`` trains (every pair its own fresh FM code) is a ceiling for
reports, not what the lookup can give a VM: trained on it, a VM learns to trust an exact code on
every row and meets item means, user means and zeros in serving.

For each consumer (``[[models.consumers]]``) ``train_consumers`` reads the served rows of the last
``[models] served_window_hours`` hours of the log that have any, splits them by time
(``model.data.split_by_time``), and trains on the same rows, with the same seed:
- the consumer's VM fed the served embedding and tier (``vm_<name>_solaris`` in the registry);
- the plain VM, as the reference: the served VM's metrics carry both NEs on the same test rows,
  with a paired-bootstrap interval, and the promotion gate refuses a served VM that is worse.
Where the window holds fewer than ``[models] served_min_rows`` rows of a consumer (a new
deployment, a small surface, embeddings of another size after an autoencoder change), no served VM
is trained: the plain VM ``vm_<name>`` keeps serving that consumer, and the decision says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from model import data as mdata
from model import interface, metrics, registry
from model.features import Vocab, build_examples, row_inputs
from model.tiers import NONE as TIER_NONE
from model.tiers import TIERS
from model.train import bce_loss, fit, infer, n_params, pick_device, sigmoid
from model.promotion import SERVED as TRAINED_ON  # window.json's trained_on: the gate tells served VMs by it
from model.vm import TRAINED


def served_inputs(df: pd.DataFrame, dim: int, exact_only: bool = False) -> dict[str, np.ndarray]:
    """The VM's FM input as served: the embedding and tier code (exact_only: other tiers as none)."""
    tier = df["tier"].map({t: i for i, t in enumerate(TIERS)}).to_numpy()
    if np.isnan(tier.astype(float)).any():
        raise ValueError(f"unknown tiers in request_features: {sorted(set(df['tier']) - set(TIERS))}")
    tier = tier.astype(np.int64)
    emb = np.stack(df["embedding"].map(lambda e: np.asarray(e, np.float32)).to_numpy()) if len(df) \
        else np.zeros((0, dim), np.float32)
    if emb.shape[1] != dim:
        raise ValueError(f"served embeddings have {emb.shape[1]} dimensions, the autoencoder makes {dim}")
    if exact_only:
        keep = tier == TIERS.index("exact")
        emb, tier = np.where(keep[:, None], emb, 0.0).astype(np.float32), np.where(keep, tier, TIER_NONE)
    return {"fm": emb, "tier": tier}


def masked(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same rows as if nothing had been served: zeros, tier none."""
    return {**x, "fm": np.zeros_like(x["fm"]), "tier": np.full(len(x["tier"]), TIER_NONE, np.int64)}


def consumer_rows(cfg, rows: pd.DataFrame, consumer, source: str | None = None) -> pd.DataFrame:
    """The served rows a consumer reads, as training picks them (``model.training.consumer_rows``:
    its surface, its task's label known), labelled with its task (another task's label from
    request_log). Possibly empty."""
    from model.training import consumer_rows as reads, label_column

    column = label_column(consumer.task)
    if column != "label":
        labels = mdata.read_table(cfg, "request_log", ["request_id", "item_id", column], source)
        rows = rows.drop(columns=["label"]).merge(labels, on=["request_id", "item_id"], how="left", validate="one_to_one")
    return rows.iloc[reads(rows, consumer)].rename(columns={column: "label"}).reset_index(drop=True)


def window_rows(cfg, hours: float, until=None, source: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The served rows of the ``hours`` before ``until`` (default: just after the newest served
    row), and where that window lies; with them, flagged ``shadow``, the rows a rollout's new code
    space would have served in the same window. No ``request_features`` table yet is an empty window."""
    try:
        rows = mdata.served_rows(cfg, None, until, source).assign(shadow=False)
    except FileNotFoundError:
        return pd.DataFrame(), {"from": None, "to": None, "hours": hours}
    end = pd.Timestamp(until) if until is not None else (rows["ts"].max() + pd.Timedelta(microseconds=1)
                                                          if len(rows) else None)
    if end is None:
        return rows, {"from": None, "to": None, "hours": hours}
    start = end - pd.Timedelta(hours=hours)
    try:
        shadow = mdata.served_rows(cfg, start, end, source, table="shadow_request_features").assign(shadow=True)
        rows = pd.concat([rows, shadow], ignore_index=True) if len(shadow) else rows
    except FileNotFoundError:  # no rollout ever ran
        pass
    return rows[rows["ts"] >= start].reset_index(drop=True), {"from": str(start), "to": str(end), "hours": hours}


def choose_code_space(rows: pd.DataFrame, newest: str, min_rows: int) -> str:
    """The code space the consumers are trained on now: the newest that the window holds at least
    ``min_rows`` rows of, asking first the config's newest, then the spaces resolved in shadow (a
    rollout's new FM or autoencoder), then those served, the most recently seen first. ``newest``
    when none has enough (the consumers then keep their VMs, and the log says why)."""
    if not len(rows) or "code_version" not in rows:
        return newest
    known = rows[rows["code_version"].notna()]
    order = [newest]
    for shadow in (True, False):
        seen = known[known["shadow"] == shadow].groupby("code_version")["ts"].max().sort_values(ascending=False)
        order += [v for v in seen.index if v not in order]
    counts = known["code_version"].value_counts()
    return next((v for v in order if counts.get(v, 0) >= min_rows), newest)


def train_consumers(cfg, ec, source: str | None = None, until=None, log=print) -> dict:
    """Train every consumer's served VM on the served rows of the window, or decide that its plain
    VM keeps serving it. Returns {"models": registry name -> saved folder, "decisions": one per
    consumer, "window": the served window}."""
    from model.registry import consumer_name
    from model.training import ModelChoice

    t0 = time.perf_counter()
    m = cfg.models
    choice = ModelChoice.from_config(cfg)
    try:
        newest = registry.code_version(registry.resolve_models(cfg))
    except FileNotFoundError as e:  # e.g. fm_version = "promoted" before anything was promoted
        why = f"no model set whose codes it could learn yet: {e}"
        log(f"  consumers not trained: {why}")
        return {"models": {}, "window": {}, "seconds": round(time.perf_counter() - t0, 1),
                "decisions": [{"consumer": c.name, "model": consumer_name(c.name, "solaris"), "trained": False,
                               "rows": 0, "reason": why} for c in choice.consumers]}
    rows, window = window_rows(cfg, m.served_window_hours, until, source)
    # A consumer learns one code space: in a rollout the new one, from the rows it would have served
    # (shadow), once there are enough; rows of other spaces (or from before code versions were
    # recorded) are not its input
    version = choose_code_space(rows, newest, m.served_min_rows)
    try:
        space_models = registry.code_space_models(cfg.models_root, version)
    except (FileNotFoundError, ValueError):
        space_models = registry.resolve_models(cfg)  # (then too few rows of it: nothing is trained)
    dim = registry.autoencoder_code_dim(space_models["autoencoder"])
    if len(rows):
        other_version = rows["code_version"].ne(version).to_numpy() if "code_version" in rows else np.ones(len(rows), bool)
        window["rows_shadow"] = int((rows["shadow"].to_numpy() & ~other_version).sum())
        rows = rows[~other_version].reset_index(drop=True)
        window["rows_other_code_version"] = int(other_version.sum())
    window["code_version"] = version
    if window.get("rows_shadow") or version != newest:
        log(f"  rollout: the consumers learn code space {version} ({window.get('rows_shadow', 0):,} of its rows "
            f"resolved in shadow)" + ("" if version == newest else
                                      f"; the newest, {newest}, has fewer than [models] served_min_rows in the window yet"))
    events = items = None
    saved, decisions = {}, []
    for c in choice.consumers:
        mine = consumer_rows(cfg, rows, c, source) if len(rows) else rows
        sizes = mine["embedding"].map(len) if len(mine) else pd.Series([], dtype=np.int64)
        other_size = int((sizes != dim).sum())  # codes of another autoencoder: not this VM's input
        mine = mine[(sizes == dim).to_numpy()].reset_index(drop=True) if len(mine) else mine
        name = consumer_name(c.name, "solaris")
        if len(mine) < m.served_min_rows:
            why = (f"{len(mine):,} served rows of consumer {c.name!r} in the window"
                   f"{f' ({other_size:,} more with codes of another size than {dim})' if other_size else ''}, "
                   f"fewer than [models] served_min_rows = {m.served_min_rows:,}: the plain VM "
                   f"{consumer_name(c.name)} keeps serving it")
            log(f"  {name}: not trained, {why}")
            decisions.append({"consumer": c.name, "model": name, "trained": False, "rows": len(mine),
                              "rows_other_code_size": other_size, "reason": why})
            continue
        if events is None:
            events, items = mdata.events_and_items(cfg, source)
        vm, result = train_on_served(c, mine, events, items, dim, ec, m.device, log)
        result["rows_other_code_size"] = other_size
        trained_window = {**result.pop("window"), "served_window": window, "trained_on": TRAINED_ON,
                          "code_version": version, "consumer": c.name, "source": source}
        vocab = {"vocab.json": json.dumps(result.pop("vocab").values)}
        saved[name] = str(registry.save(cfg.models_root, name, vm, result, trained_window, vocab))
        log(f"  {name}: trained on {len(mine):,} served rows, test NE {result['ne']:.4f} against the plain VM's "
            f"{result['ne_vm']:.4f} on the same rows ({result['ne_vs_vm_pct']:+.2f}% "
            f"[{result['ne_vs_vm_pct_ci'][0]:+.2f}, {result['ne_vs_vm_pct_ci'][1]:+.2f}])")
        decisions.append({"consumer": c.name, "model": name, "trained": True, "rows": len(mine),
                          "rows_other_code_size": other_size, "version": saved[name],
                          "reason": f"trained on {len(mine):,} served rows"})
    return {"models": saved, "decisions": decisions, "window": window,
            "seconds": round(time.perf_counter() - t0, 1)}


def train_on_served(c, rows: pd.DataFrame, events: pd.DataFrame, items: pd.DataFrame, dim: int, ec,
                    device_name: str = "auto", log=print):
    """(the consumer ``c``'s VM trained on ``rows`` with their served embedding and tier, its
    metrics): the plain VM trained on the same split with the same seed is the reference, so
    ``ne_vs_vm_pct`` and its interval compare the two on the same test requests."""
    from model.training import vm_ids, vm_sizes

    device = pick_device(device_name)
    vm_train = replace(ec.vm_train, device=str(device))
    splits = mdata.split_by_time(rows, ec.split)
    # The VM's ids are those of its own training rows: an id first seen later reads the unknown
    # row, which id dropout trains (model.vm), as in model.training
    vocab = Vocab.of_rows(splits["train"])
    x = {k: {**row_inputs(build_examples(v, events, vocab, 1, items)), **vm_ids(vocab, v)} for k, v in splits.items()}
    served = {k: {**x[k], **served_inputs(v, dim)} for k, v in splits.items()}
    preds, models = {}, {}
    for label, inputs, use_fm in (("VM", x, False), ("served", served, True)):
        torch.manual_seed(vm_train.seed)  # the same initial weights whatever ran before: a paired comparison
        vm = interface.build(c.vm_class, {**vm_sizes(vocab), **TRAINED, "use_fm_embedding": use_fm, "fm_dim": dim},
                             c.params)
        fitted = fit(vm, bce_loss, inputs["train"], inputs["val"], vm_train, lambda *_: None)
        log(f"  {c.name}, {'plain VM' if label == 'VM' else 'served VM'} on served rows: {len(fitted['epochs'])} "
            f"epochs, best validation NE {fitted['best_val_ne']:.4f}")
        preds[label], models[label] = sigmoid(infer(vm, vm, inputs["test"], device=device)), vm
    y = x["test"]["label"]
    ci = metrics.paired_bootstrap(y, preds, splits["test"]["request_id"].to_numpy(), baseline="VM",
                                  resamples=ec.bootstrap_resamples, seed=ec.split.seed)
    s, ne_vm = metrics.summary(y, preds["served"]), metrics.normalized_entropy(y, preds["VM"])
    tiers = splits["train"]["tier"].value_counts(normalize=True)
    result = {**s, "ne_ci": ci["served"]["ne"], "ne_vm": ne_vm, "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm,
              "ne_vs_vm_pct_ci": ci["served"]["ne_delta_pct_ci"], "params": n_params(models["served"]),
              "train_tier_shares": {t: float(tiers.get(t, 0.0)) for t in TIERS},
              "window": mdata.window(splits, None), "vocab": vocab}
    return models["served"], result
