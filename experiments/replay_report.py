"""The replay evaluation's report: ``report.md``, ``result.json`` and PNG plots (matplotlib) in one folder.

Pure rendering of the dict ``experiments.replay.run`` returns; nothing here reads the lake.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from feature_store.resolution import ORDER
from model.metrics import format_interval as ci
from model.metrics import transfer_label
from model.training import LEAKING, leaking_mark

PAPER = {"VM + KD (soft labels)": "transfer 20-25%", "VM + SOLARIS (served)": "transfer 42-44%, NE -0.05..-0.10%"}
COLORS = {"exact": "#2b8cbe", "item_mean": "#0868ac", "user_mean": "#7bccc4", "neighbor": "#bae4bc", "none": "#d9d9d9"}


def pct(x: float, digits: int = 1, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:+.{digits}f}%" if sign else f"{100 * x:.{digits}f}%"


def per_hour(point: dict, key: str) -> float:
    """Mean of a precompute counter over the replay's hourly cycles."""
    return sum(c[key] for c in point["cycles"]) / max(len(point["cycles"]), 1)


def served_per_hour(point: dict, w: dict) -> float:
    hours = (w["end"] - w["measure_from"]).total_seconds() / 3600
    return point["served"] / hours


def consumers_markdown(r: dict) -> list[str]:
    """Coverage and served NE per consumer VM of the config (``[[models.consumers]]``)."""
    if not r.get("consumers"):
        return []
    w = r["window"]
    out = ["", "## Per consumer: coverage and NE as served", "",
           f"Every VM that reads the embeddings, on its own rows of the replay (its surface, its label): the tier "
           f"each of its candidates of [{w['measure_from']:%H:%M}, {w['end']:%H:%M}) was served, and its variants on "
           "the test hours. The FM learned clicks: a consumer of another task has no FM row, KD teacher or transfer ratio.", "",
           "| consumer | task | surface | " + " | ".join(ORDER) + " | test rows | VM NE | VM + SOLARIS (served) vs VM "
           "[95% CI] | oracle vs VM [95% CI] | served transfer ratio [95% CI] |",
           "|---|---|---|" + "---:|" * (len(ORDER) + 5)]
    for name, c in r["consumers"].items():
        rows = {x["model"]: x for x in c["rows"]}
        served, oracle = rows["VM + SOLARIS (served)"], rows["VM + FM embedding (oracle)"]
        tr = ("n/a: the FM does not predict this task" if c["fm_beats_vm"] is None else
              transfer_label(served["transfer_ratio"], served.get("transfer_ratio_ci"), c["fm_beats_vm"],
                             bool(r.get("leaking_candidates"))))
        out.append(f"| {name} | {c['task']} | {c['surface'] or 'all'} | "
                   + " | ".join(pct(c["coverage"].get(t, 0.0)) for t in ORDER)
                   + f" | {c['window']['test']['rows']:,} | {rows['VM']['ne']:.4f} | "
                     f"{served['ne_vs_vm_pct']:+.2f}% {ci(served['ne_vs_vm_pct_ci'], '+.2f')} | "
                     f"{oracle['ne_vs_vm_pct']:+.2f}% {ci(oracle['ne_vs_vm_pct_ci'], '+.2f')} | {tr} |")
    return out


def vintage_markdown(e: dict | None) -> list[str]:
    """The vintage ablation: one tier's test rows, each model fed the pair's code of each vintage."""
    if not e:
        return []
    out = ["", f"## What a code carries on the {e['tier']} rows, by its vintage (test hours)", "",
           f"{e['rows']:,} rows ({pct(e['share'])} of the test candidates, CTR {e['ctr']:.3f}); "
           f"{pct(e['served_is_the_runs_code'])} of them were served the code their serving run computed for the "
           f"pair (on exact rows the rest carry an earlier run's, within the TTL); precompute's guessed context found for "
           f"{pct(e['context_guessed'])} (the rest: the request's own). Every model scored on the same rows; "
           "intervals: the bootstrap over seeds and requests.", "",
           "| model, fed | NE | NE vs VM [95% CI] |", "|---|---:|---:|"]
    for t in e["table"]:
        out.append(f"| {t['model']} | {t['ne']:.4f} | {t['ne_vs_vm_pct']:+.2f}% {ci(t['ne_vs_vm_pct_ci'], '+.2f')} |")
    return out


def seeds_text(r: dict) -> str:
    seeds = r.get("seeds") or [r["seed"]]
    return f"VM variants trained with seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]} (one seed)"


def markdown(r: dict) -> str:
    """The replay's report: the VM variants, coverage, the FM's work and the serving cost, NE by
    tier, the vintage ablation, the consumers, the miss queue and the initial models."""
    v = r["variants"]
    better, leaking = v["fm_beats_vm"], bool(r.get("leaking_candidates"))
    out = [*summary_markdown(r, leaking), *variants_markdown(r, better, leaking), *coverage_markdown(r, better, leaking),
           *fm_work_markdown(r), *tiers_markdown(v), *vintage_markdown(v.get("vintage_ablation")),
           *consumers_markdown(r), *miss_queue_markdown(r), *initial_models_markdown(r, leaking)]
    return "\n".join(out) + "\n"


def summary_markdown(r: dict, leaking: bool) -> list[str]:
    """The title, the leak mark when the candidates leak, and the windows in one paragraph."""
    w, v, main = r["window"], r["variants"], r["points"][r["main"]]
    out = [f"# Replay evaluation: {r['source']}", ""]
    if leaking:
        out += [leaking_mark(r["leaking_candidates"]), ""]
    return out + [
        f"Models (FM, autoencoder, verifier VM) trained on the requests before {w['train_until']:%Y-%m-%d %H:%M}; "
        f"hourly cycles {w['start']:%Y-%m-%d %H:%M} .. {w['end']:%H:%M} ({len(main['cycles'])} cycles, misses "
        f"queued); coverage over [{w['measure_from']:%H:%M}, {w['end']:%H:%M}); VM variants trained on "
        f"[{w['start']:%H:%M}, {w['test_from']:%H:%M}) (the latest 20% of those requests validate) and tested on "
        f"[{w['test_from']:%H:%M}, {w['end']:%H:%M}). Main setting {r['main']}; {seeds_text(r)}; "
        f"{r['seconds']:.0f} s on {v['device']}.", ""]


def variants_markdown(r: dict, better: bool, leaking: bool) -> list[str]:
    """The VM variants on the test hours with their intervals, the verdict on the FM's gain (a
    transfer ratio only when the FM beats the VM), and the Bayes NE of a simulated log."""
    w, v = r["window"], r["variants"]
    test = v["window"]["test"]
    rows = {x["model"]: x for x in v["rows"]}
    ne_vm, ne_fm = rows["VM"]["ne"], rows["FM"]["ne"]
    out = [f"## VM variants on the test hours ({test['rows']:,} candidates, {test['requests']:,} requests, "
           f"CTR {test['ctr']:.3f})", "",
           "| model | params | NE [95% CI] | AUC [95% CI] | calibration | NE vs VM [95% CI] | AUC vs VM [95% CI] "
           "| transfer ratio [95% CI] | paper |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for x in v["rows"]:
        tr = "" if x["model"] in ("VM", "FM") else transfer_label(x["transfer_ratio"], x["transfer_ratio_ci"], better, leaking)
        out.append(f"| {x['model']}{LEAKING if leaking else ''} | {x['params']:,} | {x['ne']:.4f} {ci(x['ne_ci'], '.4f')} | "
                   f"{x['auc']:.4f} {ci(x['auc_ci'], '.4f')} | {x['calibration']:.3f} | "
                   f"{x['ne_vs_vm_pct']:+.2f}% {ci(x['ne_vs_vm_pct_ci'], '+.2f')} | "
                   f"{x['auc_vs_vm']:+.4f} {ci(x['auc_vs_vm_ci'], '+.4f')} | {tr} | {PAPER.get(x['model'], '')} |")
    lo, hi = rows["FM"]["ne_vs_vm_pct_ci"]
    b = v["bootstrap"]
    over = (f"the {b.get('seeds', 1)} training seeds and the {b['groups']:,} test requests (each resample draws seeds, "
            f"then requests, with replacement; every figure is the mean over the seeds)" if b.get("seeds", 1) > 1
            else f"the {b['groups']:,} test requests (one training seed)")
    verdict = (f"Intervals: paired bootstrap over {over}, {b['resamples']:,} resamples. "
               + (f"The FM beats the VM by {100 * (ne_vm - ne_fm) / ne_vm:.2f}% NE (interval of the NE delta "
                  f"[{lo:+.2f}%, {hi:+.2f}%]), so transfer ratios are shown." if better else
                  f"The FM does not beat the VM with an interval that excludes zero (NE {ne_fm:.4f} vs {ne_vm:.4f}, "
                  f"delta [{lo:+.2f}%, {hi:+.2f}%]): there is no gain to transfer, and no transfer ratio is shown."))
    gated = v.get("gated_tiers", [])
    verdict += (" Tier-gated: the served VM scores every row except those of the tiers where it was worse than the "
                "VM on the validation hours (" + (", ".join(gated) or "none") + "), which the VM scores.")
    out += ["", verdict, "",
            f"Windows: the FM (and the verifier) trained on the requests before {w['train_until']:%Y-%m-%d %H:%M}, the "
            f"VM variants on the replay hours [{w['start']:%H:%M}, {w['test_from']:%H:%M}): the FM row above is not "
            f"trained on the VM's window. The comparison on one window, the models' own time split before the "
            f"replay, is under \"Initial models\" below."]
    if r.get("bayes"):
        from experiments.truth import to_markdown as bayes_markdown

        out += ["", "### Against the Bayes NE (the simulated log's true click probabilities)", "",
                bayes_markdown(r["bayes"])]
    return out


def coverage_markdown(r: dict, better: bool, leaking: bool) -> list[str]:
    """Coverage by tier of the main setting, by hour, then every setting's coverage, NE and FM work."""
    w, v, main = r["window"], r["variants"], r["points"][r["main"]]
    out = ["", "## Coverage by tier", "",
           f"Served candidates of [{w['measure_from']:%H:%M}, {w['end']:%H:%M}), setting {r['main']}: "
           + ", ".join(f"{t} {pct(main['coverage'].get(t, 0.0))}" for t in ORDER)
           + f" ({main['served']:,} candidates). By hour (![coverage over time](coverage_over_time.png)):", "",
           "| hour | candidates | " + " | ".join(ORDER) + " |", "|---|---:|" + "---:|" * len(ORDER)]
    for h in main["hourly"]:
        n = sum(h[t] for t in ORDER)
        out.append(f"| {h['hour']:%m-%d %H:%M} | {n:,} | " + " | ".join(pct(h[t] / n) for t in ORDER) + " |")
    out += ["", "## Coverage, NE and FM work against budget and TTL", "",
            "NE of VM + SOLARIS (served) trained and tested on each setting's served features "
            "(![budget and TTL](budget_ttl.png)).", "",
            "| budget | TTL | " + " | ".join(ORDER) + " | NE | NE vs VM | transfer | FM inferences / h | replay s |",
            "|---:|---:|" + "---:|" * (len(ORDER) + 5)]
    by_point = {x["point"]: x for x in v["by_point"]}
    for name, p in sorted(r["points"].items(), key=lambda kv: (kv[1]["ttl_hours"], kv[1]["budget"])):
        e = by_point[name]
        out.append(f"| {100 * p['budget']:g}% | {p['ttl_hours']:g} h | "
                   + " | ".join(pct(p["coverage"].get(t, 0.0)) for t in ORDER)
                   + f" | {e['ne']:.4f} | {e['ne_vs_vm_pct']:+.2f}% | {transfer_label(e['transfer_ratio'], None, better, leaking)} | "
                     f"{per_hour(p, 'pairs_embedded'):,.0f} | {p['seconds']:.0f} |")
    return out


def fm_work_markdown(r: dict) -> list[str]:
    """FM inferences per hour of SOLARIS against precomputing every pair and running the FM online,
    and what the lookup adds to a request against the FM online."""
    w, v, main = r["window"], r["variants"], r["points"][r["main"]]
    solaris, spec, online = (per_hour(main, "pairs_embedded"), per_hour(main, "pairs_scored"),
                             served_per_hour(main, w))
    lk, fm = r["lookup_ms"], v["fm_online_ms"]
    return ["", "## FM inferences per hour (setting " + r["main"] + ")", "",
            "![FM inferences per cycle](fm_inferences.png)", "",
            "| strategy | FM inferences / h | vs SOLARIS |", "|---|---:|---:|",
            f"| SOLARIS: the verifier's top share, fresh pairs skipped | {solaris:,.0f} | 1.0x |",
            f"| precompute every speculated pair | {spec:,.0f} | {spec / max(solaris, 1):.1f}x |",
            f"| FM online on every served candidate | {online:,.0f} | {online / max(solaris, 1):.1f}x |", "",
            f"Serving path: the embedded lookup over the test hours' requests adds p50 {lk['p50']:.3f} ms, "
            f"p99 {lk['p99']:.3f} ms per request ({lk['requests']:,} requests, snapshot {lk['snapshot_run_id']}); "
            f"running the FM online instead would add p50 {fm['p50']:.2f} ms, p99 {fm['p99']:.2f} ms per request "
            f"(FM + autoencoder forward over {fm['candidates_mean']:.1f} candidates on the CPU, histories already "
            f"in memory). HTTP and Redis numbers: benchmarks/RESULTS.md, the lookup benchmark."]


def tiers_markdown(v: dict) -> list[str]:
    """NE by tier: the served model against the VM and against itself fed nothing served."""
    out = ["", "## NE by tier (VM + SOLARIS served, test hours)", "",
           "Each tier's rows scored by the served model, by the VM, and by the served model fed "
           "\"nothing served\" (zeros, tier none) on the same rows (![NE by tier](ne_by_tier.png)).", "",
           "| tier | candidates | share | CTR | NE VM | NE served | NE served, embedding masked | NE oracle "
           "| served vs VM [95% CI] | served vs masked |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in v["by_tier"]:
        if not t["pairs"]:
            out.append(f"| {t['tier']} | 0 | 0.0% | | | | | | | |")
            continue
        out.append(f"| {t['tier']} | {t['pairs']:,} | {pct(t['share'])} | {t['ctr']:.3f} | {t['ne_vm']:.4f} | "
                   f"{t['ne_served']:.4f} | {t['ne_served_masked']:.4f} | {t['ne_oracle']:.4f} | "
                   f"{t['served_vs_vm_pct']:+.2f}% {ci(t.get('served_vs_vm_pct_ci', (float('nan'),) * 2), '+.2f')} | "
                   f"{t['served_vs_masked_pct']:+.2f}% |")
    return out


def miss_queue_markdown(r: dict) -> list[str]:
    main = r["points"][r["main"]]
    q = main["miss_queue"].get("replay", {"pairs": 0, "consumed": 0})
    return ["", f"Miss queue: {q['pairs']:,} misses recorded, {q['consumed']:,} taken in by a later cycle "
                f"(queue_in per cycle: {', '.join(str(c['queue_in']) for c in main['cycles'])})."]


def initial_models_markdown(r: dict, leaking: bool) -> list[str]:
    """The FM and the VMs on one window, their own time split before the replay."""
    out = ["", "## Initial models (FM and VMs on one window: their own time split, before the replay)", "",
           "| model | NE [95% CI] | AUC [95% CI] | calibration | NE vs VM [95% CI] | transfer ratio [95% CI] |",
           "|---|---:|---:|---:|---:|---:|"]
    init = r["initial_models"]
    for x in init["rows"]:
        tr = "" if x["model"] in ("VM", "FM") else transfer_label(x["transfer_ratio"], x.get("transfer_ratio_ci"),
                                                                  init.get("fm_beats_vm"), leaking)
        out.append(f"| {x['model']}{LEAKING if leaking else ''} | {x['ne']:.4f} {ci(x['ne_ci'], '.4f')} | {x['auc']:.4f} {ci(x['auc_ci'], '.4f')} | "
                   f"{x['calibration']:.3f} | {x['ne_vs_vm_pct']:+.2f}% {ci(x['ne_vs_vm_pct_ci'], '+.2f')} | {tr} |")
    if init.get("bayes"):
        from experiments.truth import to_markdown as bayes_markdown

        out += ["", bayes_markdown(init["bayes"])]
    return out


def plots(r: dict, out: Path) -> list[Path]:
    """The report's figures as PNG files in ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, draw in (("coverage_over_time.png", coverage_over_time_figure), ("budget_ttl.png", budget_ttl_figure),
                       ("fm_inferences.png", fm_inferences_figure), ("ne_by_tier.png", ne_by_tier_figure),
                       ("variants.png", variants_figure)):
        fig = draw(plt, r)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths


def coverage_over_time_figure(plt, r: dict):
    """The main setting's tier shares per request hour, stacked, with the measured and test windows."""
    w, main = r["window"], r["points"][r["main"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    hours = [h["hour"] for h in main["hourly"]]
    bottom = [0.0] * len(hours)
    for t in ORDER:
        share = [h[t] / max(sum(h[x] for x in ORDER), 1) for h in main["hourly"]]
        ax.bar(range(len(hours)), share, bottom=bottom, color=COLORS[t], label=t)
        bottom = [b + s for b, s in zip(bottom, share)]
    ax.set_xticks(range(len(hours)), [f"{h:%H:%M}" for h in hours], rotation=45)
    for when, label in ((w["measure_from"], "measured from"), (w["test_from"], "test from")):
        if when in hours:
            ax.axvline(hours.index(when) - 0.5, color="k", ls="--", lw=1)
            ax.text(hours.index(when) - 0.45, 1.02, label, fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("share of served candidates")
    ax.set_title(f"{r['source']}: coverage by tier per request hour ({r['main']})")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def budget_ttl_figure(plt, r: dict):
    """Coverage by tier and the served NE against the budget (at the main TTL) and the TTL (at the
    main budget)."""
    by_point = {x["point"]: x for x in r["variants"]["by_point"]}
    m = r["points"][r["main"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, fixed, label in ((axes[0], "budget", "ttl_hours", "precompute budget"),
                                  (axes[1], "ttl_hours", "budget", "TTL (hours)")):
        pts = sorted((p for p in r["points"].items() if p[1][fixed] == m[fixed]), key=lambda kv: kv[1][key])
        xs = [p[key] * (100 if key == "budget" else 1) for _, p in pts]
        for t in ORDER:
            ax.plot(xs, [p["coverage"].get(t, 0.0) for _, p in pts], "o-", color=COLORS[t] if t != "none" else "#888",
                    label=t)
        ax.set_xlabel(label + (" (%)" if key == "budget" else ""))
        ax.set_ylabel("share of served candidates")
        ax.set_ylim(0, 1)
        twin = ax.twinx()
        twin.plot(xs, [by_point[n]["ne_vs_vm_pct"] for n, _ in pts], "s--", color="#d95f0e", label="NE vs VM (%)")
        twin.set_ylabel("NE vs VM (%)", color="#d95f0e")
        if key == "ttl_hours":
            ax.set_xscale("log")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{r['source']}: coverage and NE of VM + SOLARIS (served) against budget and TTL")
    return fig


def fm_inferences_figure(plt, r: dict):
    """FM inferences per cycle: SOLARIS, precomputing every speculated pair, the FM online."""
    main = r["points"][r["main"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    cycles = main["cycles"]
    xs = [f"{c['interval_end']:%H:%M}" for c in cycles]
    served = {h["hour"]: sum(h[t] for t in ORDER) for h in main["hourly"]}
    ax.plot(xs, [c["pairs_embedded"] for c in cycles], "o-", label="SOLARIS (FM inferences)")
    ax.plot(xs, [c["pairs_scored"] for c in cycles], "s-", label="precompute every speculated pair")
    ax.plot(xs, [served.get(c["interval_end"], 0) for c in cycles], "^-", label="FM online (candidates served in the hour)")
    ax.set_yscale("log")
    ax.set_xlabel("cycle")
    ax.set_ylabel("FM inferences")
    ax.set_title(f"{r['source']}: FM work per hour ({r['main']})")
    ax.legend(fontsize=8)
    return fig


def ne_by_tier_figure(plt, r: dict):
    """NE per served tier: the VM, the served model, the served model fed nothing, the oracle."""
    fig, ax = plt.subplots(figsize=(8, 4))
    tiers = [t for t in r["variants"]["by_tier"] if t["pairs"]]
    series = (("ne_vm", "VM"), ("ne_served", "served"), ("ne_served_masked", "served, embedding masked"),
              ("ne_oracle", "oracle"))
    width = 0.8 / len(series)
    for j, (key, label) in enumerate(series):
        ax.bar([i + j * width for i in range(len(tiers))], [t[key] for t in tiers], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tiers))],
                  [f"{t['tier']}\n({100 * t['share']:.0f}%)" for t in tiers])
    lo = min(t[k] for t in tiers for k, _ in series)
    hi = max(t[k] for t in tiers for k, _ in series)
    ax.set_ylim(max(0.0, lo - 0.1 * (hi - lo + 1e-3)), hi + 0.1 * (hi - lo + 1e-3))
    ax.set_ylabel("NE (lower is better)")
    ax.set_title(f"{r['source']}: NE by served tier, test hours")
    ax.legend(fontsize=8)
    return fig


def variants_figure(plt, r: dict):
    """Each VM variant's NE against the VM with its 95% paired-bootstrap interval."""
    rows = r["variants"]["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [x["model"] for x in rows]
    mid = [x["ne_vs_vm_pct"] for x in rows]
    err = [[m - x["ne_vs_vm_pct_ci"][0] for m, x in zip(mid, rows)],
           [x["ne_vs_vm_pct_ci"][1] - m for m, x in zip(mid, rows)]]
    ax.barh(names, mid, xerr=err, capsize=4, color="#3182bd")  # 95% paired-bootstrap intervals
    ax.axvline(0, color="k", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel("NE vs VM (%), lower is better; bars: 95% paired-bootstrap interval")
    ax.set_title(f"{r['source']}: VM variants on the test hours")
    return fig


def jsonable(x):
    """``json.dumps``' default for a replay's results: datetimes as ISO text, numpy scalars as numbers."""
    if isinstance(x, datetime):
        return x.isoformat()
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def write(r: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(r, indent=1, default=jsonable))
    plots(r, out)
    (out / "report.md").write_text(markdown(r))
    return out
