"""VM variants trained on the features a replay served, evaluated on the replay's last hours.

Rows are ``request_features`` (the tier and embedding each logged candidate was served at its
request time) joined to ``request_log`` for the context; histories come from ``user_events``
strictly before each request. The replay's hours before ``test_from`` train (their last
``val_share`` of requests validate, for early stopping), the hours from ``test_from`` test.

Variants, all on the same rows:
- VM: no FM input;
- VM + KD (soft labels): the FM's probability as a second target;
- VM + SOLARIS (served): the embedding and tier served, in training and in test;
- VM + SOLARIS (served, tier-gated): the served VM, except on the rows of a tier where it was worse
  than the VM on the validation hours: those take the VM's prediction (both models run online; the
  tier says which one scores the row), so no tier is worse than the VM on validation;
- VM + SOLARIS (exact only): the served embedding where its tier is exact, zeros and tier none elsewhere;
- VM + FM embedding (oracle): every pair its own embedding from its history before the request,
  computed offline: the ceiling of full coverage;
- FM: the replay's FM scoring the test hours itself (what running it online would give).

The FM and autoencoder are the ones the replay precomputed with (trained before the replay).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from model import data as mdata
from model import metrics, served_training
from model.served_training import masked, served_inputs
from model.features import Vocab, build_examples, last_click_inputs, model_inputs, row_inputs, subset
from model.train import TrainConfig, batches, bce_loss, fit, infer, kd_loss, n_params, pick_device, sigmoid
from model.training import vm_ids, vm_sizes
from model.tiers import ORDER
from model.vm import TIERS, TRAINED, VerticalModel, VMConfig

VARIANTS = ("VM", "VM + KD (soft labels)", "VM + SOLARIS (served)", "VM + SOLARIS (served, tier-gated)",
            "VM + SOLARIS (exact only)", "VM + FM embedding (oracle)", "FM")
SERVED, GATED, ORACLE = "VM + SOLARIS (served)", "VM + SOLARIS (served, tier-gated)", "VM + FM embedding (oracle)"


@dataclass(frozen=True)
class ReplayEvalConfig:
    val_share: float = 0.2  # of the training hours' requests, the latest
    kd_alpha: float = 1.0
    # to convergence: early stopping on the validation hours decides (model.train.fit); epochs is a bound
    vm_train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, lr=3e-3))
    seeds: tuple[int, ...] = (7, 8, 9)  # every variant trained once per seed; intervals cover seeds and requests
    bootstrap_resamples: int = 1000  # paired bootstrap over the test requests (and the seeds)
    ablation_tier: str = "exact"  # whose test rows are fed each vintage of their pair's code (vintage_ablation)
    # every VM variant also reads the user's last click before the request and its age (model.vm): an
    # online session feature, the part of the label no precomputed code can know
    session_features: bool = False


def served_rows(cfg, tables_root, start, end, source: str | None = None) -> pd.DataFrame:
    """``model.data.served_rows`` of a replay point's lake: a lake with no served rows is a replay not run."""
    try:
        return mdata.served_rows(cfg, start, end, source, tables_root)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}: replay the hours first") from e


def consumer_rows(cfg, rows: pd.DataFrame, consumer, source: str | None = None) -> pd.DataFrame:
    """``model.served_training.consumer_rows``: a consumer with no served rows in the replay is an error."""
    rows = served_training.consumer_rows(cfg, rows, consumer, source)
    if rows.empty:
        raise ValueError(f"consumer {consumer.name!r}: no served rows with its surface and label in the replay")
    return rows


def split(rows: pd.DataFrame, test_from, val_share: float) -> dict[str, pd.DataFrame]:
    """train / val / test by request time, whole requests at a time."""
    test = rows["ts"] >= pd.Timestamp(test_from)
    first = rows[~test].groupby("request_id", sort=False)["ts"].min().sort_values(kind="stable")
    val_ids = set(first.index[int(len(first) * (1 - val_share)):])
    is_val = rows["request_id"].isin(val_ids) & ~test
    out = {"train": rows[~test & ~is_val], "val": rows[is_val], "test": rows[test]}
    for name, df in out.items():
        if df.empty:
            raise ValueError(f"the replay's {name} split is empty: test_from {test_from} leaves no "
                             f"{'hours before it' if name != 'test' else 'hours from it'} with labelled requests")
    return {k: v.reset_index(drop=True) for k, v in out.items()}


def coverage(rows: pd.DataFrame, since) -> dict[str, float]:
    """Share of the rows from ``since`` on served at each tier."""
    tiers = rows.loc[rows["ts"] >= pd.Timestamp(since), "tier"]
    return {t: float((tiers == t).mean()) if len(tiers) else float("nan") for t in ORDER}


def evaluate(cfg, rows_by_point: dict[str, pd.DataFrame], main: str, test_from, fm, ae, fm_vocab: Vocab,
             source: str | None = None, ec: ReplayEvalConfig = ReplayEvalConfig(), log=print,
             same_task: bool = True) -> dict:
    """Train and compare the variants on the ``main`` point's served rows; train VM + SOLARIS
    (served) on every other point's rows too (same requests, other budget or TTL). ``same_task``
    False: the rows' label is not the FM's (a conversion consumer), so there is no FM row, no KD
    teacher and no transfer ratio."""
    device = pick_device(cfg.models.device)
    vm_train = replace(ec.vm_train, device=str(device))
    t0 = time.perf_counter()
    events, items = mdata.events_and_items(cfg, source)
    splits = split(rows_by_point[main], test_from, ec.val_share)
    keys = {k: v[["request_id", "item_id"]] for k, v in splits.items()}
    # The VMs read ids and context only (no history), through the vocabulary of their training rows:
    # an id first seen later reads the unknown row, which id dropout trains (model.vm)
    vocab = Vocab.of_rows(splits["train"])

    def vm_inputs(rows: pd.DataFrame) -> dict[str, np.ndarray]:
        ex = build_examples(rows, events, vocab, 1, items)
        return {**row_inputs(ex), **vm_ids(vocab, rows), **(last_click_inputs(ex) if ec.session_features else {})}

    x = {k: vm_inputs(v) for k, v in splits.items()}
    y = x["test"]["label"]
    dim = ae.cfg.code_dim
    log(f"  replay rows: {', '.join(f'{k} {len(v):,}' for k, v in splits.items())} "
        f"({time.perf_counter() - t0:.0f} s)")

    # The FM reads its own vocabulary and history length (it was trained before the replay).
    xf, oracle, fm_p = {}, {}, {}
    for k, v in splits.items():
        xf[k], oracle[k], fm_p[k] = fm_pass(v, fm, ae, fm_vocab, events, items, device)

    def aligned(point: str) -> dict[str, pd.DataFrame]:
        """The point's served rows in the main point's order; every point served the same requests."""
        out = {}
        for k, key in keys.items():
            got = key.merge(rows_by_point[point], on=["request_id", "item_id"], how="left")
            if got["tier"].isna().any():
                raise ValueError(f"point {point} did not serve {int(got['tier'].isna().sum())} of the "
                                 f"{main} point's {k} candidates: the replays covered different hours")
            out[k] = got
        return out

    served = {p: aligned(p) if p != main else splits for p in rows_by_point}
    inputs = {
        "VM": lambda k: x[k],
        **({"VM + KD (soft labels)": lambda k: {**x[k], "teacher": fm_p[k].astype(np.float32)}} if same_task else {}),
        SERVED: lambda k: {**x[k], **served_inputs(served[main][k], dim)},
        "VM + SOLARIS (exact only)": lambda k: {**x[k], **served_inputs(served[main][k], dim, exact_only=True)},
        ORACLE: lambda k: {**x[k], "fm": oracle[k].astype(np.float32),
                           "tier": np.full(len(x[k]["label"]), TIERS.index("exact"))},
    }
    sizes = vm_sizes(vocab)
    seeds = tuple(ec.seeds) or (vm_train.seed,)

    def train(name: str, make, seed: int) -> tuple[VerticalModel, np.ndarray]:
        val = make("val")
        torch.manual_seed(seed)  # the initial weights too, whatever ran before in this process
        vm = VerticalModel(VMConfig(**sizes, **TRAINED, use_fm_embedding="fm" in val, fm_dim=dim,
                                    session=ec.session_features))
        fitted = fit(vm, kd_loss(ec.kd_alpha) if "teacher" in val else bce_loss, make("train"), val,
                     replace(vm_train, seed=seed), lambda *_: None)
        log(f"  trained {name}, seed {seed}: {len(fitted['epochs'])} epochs, best validation NE "
            f"{fitted['best_val_ne']:.4f}")
        return vm, sigmoid(infer(vm, vm, make("test"), device=device)), sigmoid(infer(vm, vm, val, device=device))

    models, preds, val_preds, seed_models = {}, {}, {}, {}
    for name, make in inputs.items():
        per_seed = [train(name, make, s) for s in seeds]
        models[name], preds[name] = per_seed[0][0], np.stack([p for _, p, _ in per_seed])  # (S, n)
        val_preds[name] = np.stack([v for _, _, v in per_seed])
        seed_models[name] = [m for m, _, _ in per_seed]
    served_models = seed_models[SERVED]
    gated_tiers = tiers_worse_than_vm(x["val"]["label"], inputs[SERVED]("val")["tier"], val_preds)
    test_tier = inputs[SERVED]("test")["tier"]
    preds[GATED] = np.where(np.isin(test_tier, [TIERS.index(t) for t in gated_tiers])[None, :], preds["VM"],
                            preds[SERVED])
    models[GATED] = models[SERVED]
    variants = [v for v in VARIANTS if v in inputs or v == GATED or (v == "FM" and same_task)]
    if same_task:
        preds["FM"] = fm_p["test"][None, :]
    ne_vm = metrics.seed_mean_ne(y, preds["VM"])
    ne_fm = metrics.seed_mean_ne(y, preds["FM"]) if same_task else float("nan")
    test_requests = splits["test"]["request_id"].to_numpy()
    params = {name: n_params(models.get(name, fm)) for name in variants}
    rows, intervals = compare(y, preds, variants, params, test_requests, (ne_vm, ne_fm, same_task), ec, seeds[0])

    xt = inputs[SERVED]("test")
    p_masked = np.stack([sigmoid(infer(m, m, masked(xt), device=device)) for m in served_models])
    by_tier = served_by_tier(y, xt["tier"], preds, p_masked, test_requests, ec, seeds[0])

    by_point = []
    for point in rows_by_point:
        if point == main:
            p = preds[SERVED]
        else:  # another budget or TTL: the first seed only
            _, p, _ = train(f"{SERVED} on {point}", lambda k, pt=point: {**x[k], **served_inputs(served[pt][k], dim)},
                         seeds[0])
        s = metrics.summary(y, p)
        by_point.append({"point": point, **s, "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm,
                         "transfer_ratio": metrics.transfer_ratio(ne_vm, s["ne"], ne_fm)})
    test = splits["test"]
    columns = {}
    for n in variants:
        p = np.atleast_2d(preds[n])
        columns.update({n: p[0]} if len(p) == 1 else {f"{n} [seed {s}]": row for s, row in zip(seeds, p)})
    predictions = pd.DataFrame({"request_id": test["request_id"].to_numpy(), "item_id": test["item_id"].to_numpy(),
                                "label": y, **columns})
    vintages = None
    if same_task:
        vintages = vintage_ablation(splits, rows_by_point[main], y, x["test"], oracle["test"], preds, seed_models, fm,
                                    ae, fm_vocab, events, items, device, ec, seeds[0], cfg.precompute.lookback_hours)
    return {"rows": rows, "by_tier": by_tier, "by_point": by_point, "bootstrap": intervals["_meta"], "seeds": list(seeds),
            "gated_tiers": gated_tiers, "vintage_ablation": vintages,
            "predictions": predictions,
            "fm_beats_vm": intervals["_meta"]["reference_beats_baseline"] if same_task else None,
            "window": {k: {"rows": len(v), "requests": int(v["request_id"].nunique()), "from": str(v["ts"].min()),
                           "to": str(v["ts"].max()), "ctr": float(v["label"].mean())} for k, v in splits.items()},
            "fm_online_ms": fm_request_latency(fm, ae, xf["test"], splits["test"]["request_id"].to_numpy()),
            "device": str(device), "seconds": round(time.perf_counter() - t0, 1)}


def compare(y: np.ndarray, preds: dict, variants: list[str], params: dict, requests: np.ndarray,
            references: tuple[float, float, bool], ec: ReplayEvalConfig, seed: int) -> tuple[list[dict], dict]:
    """One row per variant on the test rows (NE, AUC, calibration, against the VM, transfer ratio)
    with its paired-bootstrap intervals over requests and seeds; and the bootstrap's answer.
    ``references``: the VM's and the FM's NE as ``evaluate`` computed them, and whether the FM was
    trained for this task (else it is no reference and there is no transfer ratio)."""
    ne_vm, ne_fm, same_task = references
    rows = []
    for name in variants:
        s = metrics.summary(y, preds[name])
        rows.append({"model": name, "params": params[name], **s,
                     "ne_vs_vm_pct": 100 * (s["ne"] - ne_vm) / ne_vm,
                     "transfer_ratio": metrics.transfer_ratio(ne_vm, s["ne"], ne_fm) if name != "FM"
                     else (1.0 if ne_fm < ne_vm else float("nan"))})
    intervals = metrics.paired_bootstrap(y, {n: preds[n] for n in variants}, requests, baseline="VM",
                                         reference="FM" if same_task else None, resamples=ec.bootstrap_resamples,
                                         seed=seed)
    for r in rows:
        ci = intervals[r["model"]]
        r.update(ne_ci=ci["ne"], auc_ci=ci["auc"], ne_vs_vm_pct_ci=ci["ne_delta_pct_ci"], auc_vs_vm=ci["auc_delta"],
                 auc_vs_vm_ci=ci["auc_delta_ci"], transfer_ratio_ci=ci.get("transfer_ratio_ci"))
    return rows, intervals


def served_by_tier(y: np.ndarray, tiers: np.ndarray, preds: dict, p_masked: np.ndarray, requests: np.ndarray,
                   ec: ReplayEvalConfig, seed: int) -> list[dict]:
    """Does a fallback embedding help or hurt? The served model on each tier's rows, against the VM
    and against the same model fed "nothing served" on those rows (``p_masked``); every seed,
    intervals over both."""
    by_tier = []
    for tier in ORDER:
        sel = tiers == TIERS.index(tier)
        if not sel.any():
            by_tier.append({"tier": tier, "pairs": 0, "share": 0.0})
            continue
        yt = y[sel]
        if yt.min() == yt.max():  # one class only: the entropy of its rate is 0, NE has no meaning there
            ci = {}
        else:
            ci = metrics.paired_bootstrap(yt, {"VM": preds["VM"][:, sel], SERVED: preds[SERVED][:, sel]},
                                          requests[sel], baseline="VM", resamples=ec.bootstrap_resamples, seed=seed)
        ne = {n: metrics.seed_mean_ne(yt, preds[n][:, sel]) for n in ("VM", SERVED, ORACLE)}
        ne_masked = metrics.seed_mean_ne(yt, p_masked[:, sel])
        by_tier.append({"tier": tier, "pairs": int(sel.sum()), "share": float(sel.mean()), "ctr": float(yt.mean()),
                        "ne_vm": ne["VM"], "ne_served": ne[SERVED], "ne_served_masked": ne_masked,
                        "ne_oracle": ne[ORACLE],
                        "served_vs_vm_pct": 100 * (ne[SERVED] - ne["VM"]) / ne["VM"],
                        "served_vs_vm_pct_ci": ci[SERVED]["ne_delta_pct_ci"] if ci else (float("nan"),) * 2,
                        "served_vs_masked_pct": 100 * (ne[SERVED] - ne_masked) / ne_masked})
    return by_tier


# The vintages of a row's code, from the oracle's to what was served: on exact rows each step is one
# thing that separates a precomputed code from the FM run at the request.
VINTAGES = ("as of the request (oracle)", "as of the hour start", "as of the serving run, context guessed", "as served")


def guessed_context(test: pd.DataFrame, all_rows: pd.DataFrame, at: pd.Series, lookback_hours: float) -> pd.DataFrame:
    """The device and surface precompute gives a pair at a run at ``at`` (per test row): those of the
    user's latest request in [at - lookback, at) (``spark_jobs.speculate.candidates``). Where the
    user has none (a code from a queued miss or an older run), the request's own; ``guessed`` says which."""
    left = pd.DataFrame({"_row": np.arange(len(test)), "user_id": test["user_id"].to_numpy(),
                         "_at": pd.to_datetime(at).to_numpy()}).sort_values("_at", kind="stable")
    right = (all_rows.sort_values(["ts", "request_id"]).drop_duplicates("request_id", keep="last")
             [["user_id", "ts", "device", "surface"]].rename(columns={"device": "_device", "surface": "_surface"})
             .sort_values("ts", kind="stable"))
    got = pd.merge_asof(left, right, left_on="_at", right_on="ts", by="user_id", direction="backward",
                        allow_exact_matches=False, tolerance=pd.Timedelta(hours=lookback_hours)).sort_values("_row")
    guessed = got["_device"].notna().to_numpy() | got["_surface"].notna().to_numpy()
    out = test.copy()
    out["device"] = np.where(guessed, got["_device"].to_numpy(), test["device"].to_numpy())
    out["surface"] = np.where(guessed, got["_surface"].to_numpy(), test["surface"].to_numpy())
    out["guessed"] = guessed
    return out


def vintage_ablation(splits, all_rows, y, x_test, oracle_test, preds, seed_models, fm, ae, fm_vocab, events, items,
                     device, ec: ReplayEvalConfig, seed: int, lookback_hours: float) -> dict | None:
    """What a code carries on the rows of one tier (``ec.ablation_tier``, exact by default), by how
    old it is: the test hours' rows of that tier scored by the oracle VM (trained on the FM's code as
    of each request) and by the served VM, each fed the pair's code as of the request, as of the hour
    start (the request's context), as of the serving run with the context precompute guessed, and as
    served; beside the VM and the FM run as of the request and as of the hour start. Every figure
    against the VM on the same rows, with the hierarchical bootstrap (seeds, then requests). None
    when the tier has no test rows or one class only (NE is undefined there)."""
    test = splits["test"]
    sel = (test["tier"] == ec.ablation_tier).to_numpy()
    if not sel.any() or y[sel].min() == y[sel].max():
        return None
    rows = test[sel].reset_index(drop=True)
    hour = rows["ts"].dt.floor("h")
    # The replay publishes once an hour, at the hour: the serving run of a request is its hour's start.
    at_hour = rows.assign(ts=hour)
    at_run = guessed_context(rows, all_rows, hour, lookback_hours).assign(ts=hour)

    _, codes_hour, fm_hour = fm_pass(at_hour, fm, ae, fm_vocab, events, items, device)
    _, codes_run, _ = fm_pass(at_run.drop(columns=["guessed"]), fm, ae, fm_vocab, events, items, device)
    x_exact = subset(x_test, np.flatnonzero(sel))
    served = np.stack(rows["embedding"].map(lambda e: np.asarray(e, np.float32)))
    codes = {VINTAGES[0]: oracle_test[sel].astype(np.float32), VINTAGES[1]: codes_hour, VINTAGES[2]: codes_run,
             VINTAGES[3]: served}
    exact_tier = np.full(len(rows), TIERS.index("exact"))  # a pair's own code, as the oracle VM was trained
    served_tier = np.full(len(rows), TIERS.index(ec.ablation_tier))
    scored = {"VM": preds["VM"][:, sel], "FM as of the request": preds["FM"][:, sel],
              "FM as of the hour start": fm_hour[None, :]}
    for model in (ORACLE, SERVED):
        for vintage, c in codes.items():
            # the oracle VM knows the exact tier only; the served VM reads served codes with their own tier
            tier = served_tier if model == SERVED and vintage == VINTAGES[3] else exact_tier
            fed = {**x_exact, "fm": c, "tier": tier}
            scored[f"{model}, fed the code {vintage}"] = np.stack(
                [sigmoid(infer(m, m, fed, device=device)) for m in seed_models[model]])
    ys = y[sel]
    ci = metrics.paired_bootstrap(ys, scored, rows["request_id"].to_numpy(), baseline="VM",
                                  reference="FM as of the request", resamples=ec.bootstrap_resamples, seed=seed)
    ne_vm = metrics.seed_mean_ne(ys, scored["VM"])
    return {"tier": ec.ablation_tier, "rows": int(sel.sum()), "share": float(sel.mean()), "ctr": float(ys.mean()),
            "context_guessed": float(at_run["guessed"].mean()),
            # served the code its serving run computed (the rest: a code from an earlier run within the TTL)
            "served_is_the_runs_code": float(np.isclose(served, codes_run, atol=1e-4, rtol=1e-4).all(axis=1).mean()),
            "table": [{"model": name, "ne": metrics.seed_mean_ne(ys, p),
                       "ne_vs_vm_pct": 100 * (metrics.seed_mean_ne(ys, p) - ne_vm) / ne_vm,
                       "ne_vs_vm_pct_ci": ci[name]["ne_delta_pct_ci"]} for name, p in scored.items()]}


def fm_pass(rows: pd.DataFrame, fm, ae, fm_vocab: Vocab, events, items, device):
    """The FM on ``rows`` as of their ts (its own vocabulary and history length): its inputs, the
    autoencoder's codes of its embeddings (float32) and its click probabilities."""
    xf = model_inputs(build_examples(rows, events, fm_vocab, fm.cfg.history_len, items, fm.cfg.horizon_hours), fm.inputs)
    ae.eval()
    codes = infer(lambda b: ae.encode(fm.embed(b)), fm, xf, device=device).astype(np.float32)
    ae.to("cpu")
    return xf, codes, sigmoid(infer(fm, fm, xf, device=device))


def tiers_worse_than_vm(y: np.ndarray, tier: np.ndarray, val_preds: dict[str, np.ndarray]) -> list[str]:
    """The tiers on whose validation rows the served VM's NE (mean over seeds) is above the plain
    VM's: there the tier-gated variant scores with the plain VM."""
    out = []
    for name in ORDER:
        sel = tier == TIERS.index(name)
        if not sel.any() or y[sel].min() == y[sel].max():
            continue
        if metrics.seed_mean_ne(y[sel], val_preds[SERVED][:, sel]) > metrics.seed_mean_ne(y[sel], val_preds["VM"][:, sel]):
            out.append(name)
    return out


def fm_request_latency(fm, ae, x: dict[str, np.ndarray], request_ids: np.ndarray, requests: int = 300) -> dict:
    """What running the FM online would add per request: FM + autoencoder forward over one
    request's candidates, on the CPU, histories already in memory (so a lower bound)."""
    fm.to("cpu").eval()
    ae.to("cpu").eval()
    starts = np.flatnonzero(np.r_[True, request_ids[1:] != request_ids[:-1]])
    bounds = list(zip(starts, np.r_[starts[1:], len(request_ids)]))[:requests]
    times = []
    with torch.inference_mode():
        for s, e in bounds:
            _, b = next(batches(subset(x, np.arange(s, e)), e - s, torch.device("cpu")))
            t = time.perf_counter()
            ae.encode(fm.embed(b))
            times.append(1000 * (time.perf_counter() - t))
    return {"requests": len(times), "candidates_mean": float(np.mean([e - s for s, e in bounds])) if bounds else 0.0,
            "p50": float(np.percentile(times, 50)) if times else float("nan"),
            "p99": float(np.percentile(times, 99)) if times else float("nan")}
