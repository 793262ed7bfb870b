"""Synthetic logs: the impression world (include/synthetic_world.py, the demo's default) and a
click-only log in the generic click-log format, for the click-log adapter and its tests.

The click log's world:

- users and items have latent taste vectors; a click is drawn from a softmax over the items
  alive at that hour of ``taste . item + log(popularity)``;
- within a visit, each click pulls the next one towards items like it (session interest),
  which only a model that reads the recent history can see;
- traffic follows a daily cycle, users visit repeatedly with skewed activity, and each item's
  popularity rises after its birth and decays with its own half-life.

    python -m include.synthetic --out data/synthetic [--users 2000 --items 600 --hours 48]   # impressions
    python -m include.synthetic --mode clicks --out data/synthetic/clicks.csv [--users ...]

Click-log columns: user_id, item_id, ts (epoch ms, UTC), surface, device, region, referrer.
Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SyntheticConfig:
    users: int = 2000
    items: int = 400
    hours: int = 48
    start: str = "2026-01-05T00:00:00"  # UTC
    visits_per_hour: float = 150.0  # mean at the daily average; the cycle swings it +-70%
    dim: int = 8  # latent taste dimension
    taste_strength: float = 3.0  # how much taste (vs popularity) decides a click
    session_pull: float = 1.5  # how much the previous click in a visit steers the next
    mean_clicks_per_visit: float = 2.5
    seed: int = 7


def generate(cfg: SyntheticConfig) -> dict[str, np.ndarray]:
    """Columns of the click log, sorted by time."""
    if min(cfg.users, cfg.items, cfg.hours) < 1:
        raise ValueError("users, items and hours must all be >= 1")
    rng = np.random.default_rng(cfg.seed)
    d = cfg.dim
    user_taste = rng.normal(size=(cfg.users, d)) / np.sqrt(d)
    item_vec = rng.normal(size=(cfg.items, d)) / np.sqrt(d)
    activity = rng.lognormal(0.0, 1.0, cfg.users)
    activity /= activity.sum()
    quality = rng.lognormal(0.0, 0.5, cfg.items)
    birth = rng.uniform(-48, cfg.hours, cfg.items)  # some items exist before the log starts
    half_life = rng.uniform(6, 36, cfg.items)
    user_device = rng.choice(3, cfg.users, p=[0.55, 0.35, 0.10])
    user_region = rng.integers(0, 12, cfg.users)

    start_ms = int(datetime.fromisoformat(cfg.start).replace(tzinfo=timezone.utc).timestamp() * 1000)
    start_hour_of_day = datetime.fromisoformat(cfg.start).hour
    cols: dict[str, list] = {k: [] for k in ("user_id", "item_id", "ts", "surface", "device", "region", "referrer")}
    for h in range(cfg.hours):
        age = h + 0.5 - birth
        popularity = np.where(age > 0, (1 - np.exp(-np.maximum(age, 0) / 2.0)) * 0.5 ** (np.maximum(age, 0) / half_life), 0.0)
        alive = np.flatnonzero(popularity > 1e-4)
        if alive.size == 0:
            continue
        cycle = 1 + 0.7 * np.sin(2 * np.pi * ((start_hour_of_day + h) % 24 - 9) / 24)
        n_visits = rng.poisson(cfg.visits_per_hour * cycle)
        if n_visits == 0:
            continue
        users = rng.choice(cfg.users, n_visits, p=activity)
        clicks_per_visit = 1 + rng.poisson(cfg.mean_clicks_per_visit - 1, n_visits)
        visit_start = rng.uniform(0, 3600 * 1000 - 60_000, n_visits)
        base = cfg.taste_strength * user_taste[users] @ item_vec[alive].T + np.log(popularity[alive] * quality[alive])
        last = np.full(n_visits, -1)
        for k in range(int(clicks_per_visit.max())):
            active = np.flatnonzero(clicks_per_visit > k)
            logits = base[active].copy()
            prev = last[active]
            has_prev = prev >= 0
            if has_prev.any():  # session interest: the last click's neighbourhood is more likely
                logits[has_prev] += cfg.session_pull * item_vec[prev[has_prev]] @ item_vec[alive].T * np.sqrt(d)
                logits[has_prev, :] -= np.where(alive[None, :] == prev[has_prev, None], 50.0, 0.0)
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            picks = alive[(p.cumsum(axis=1) > rng.random((active.size, 1))).argmax(axis=1)]
            last[active] = picks
            u = users[active]
            cols["user_id"].append(u)
            cols["item_id"].append(picks)
            cols["ts"].append(start_ms + h * 3_600_000 + (visit_start[active] + k * 30_000).astype(np.int64))
            cols["surface"].append(np.where(k == 0, 1, 2) * np.ones(active.size, dtype=np.int64))
            cols["device"].append(user_device[u])
            cols["region"].append(user_region[u])
            cols["referrer"].append(rng.integers(1, 5, active.size))
    out = {k: np.concatenate(v) if v else np.array([], dtype=np.int64) for k, v in cols.items()}
    order = np.argsort(out["ts"], kind="stable")
    out = {k: v[order] for k, v in out.items()}
    out["user_id"] = np.char.add("u", out["user_id"].astype(str))
    out["item_id"] = np.char.add("i", out["item_id"].astype(str))
    return out


def write_csv(columns: dict[str, np.ndarray], path: str | Path) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(columns)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(zip(*(columns[n].tolist() for n in names)))
    return len(columns["ts"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m include.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="impressions: the folder to write; clicks: the CSV file")
    p.add_argument("--mode", choices=["impressions", "clicks"], default="impressions",
                   help="impressions (default): the world with a known click probability "
                        "(include/synthetic_world.py); clicks: a click-only log in the generic click-log format")
    p.add_argument("--users", type=int)
    p.add_argument("--items", type=int)
    p.add_argument("--hours", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--start", help="UTC start, ISO format")
    p.add_argument("--visits-per-hour", type=float)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    given = {k: v for k, v in vars(a).items() if k not in ("out", "mode") and v is not None}
    if a.mode == "clicks":
        cfg = SyntheticConfig(**given)
        n = write_csv(generate(cfg), a.out)
        print(f"wrote {n:,} clicks ({cfg.users} users, {cfg.items} items, {cfg.hours} h from {cfg.start} UTC) to {a.out}")
        return 0
    from include import synthetic_world

    wcfg = synthetic_world.WorldConfig(**given)
    world = synthetic_world.generate(wcfg)
    paths = synthetic_world.write(world, a.out)
    imp = world["impressions"]
    print(f"wrote {len(imp['ts']):,} impressions ({int(imp['label'].sum()):,} clicks; {wcfg.users} users, {wcfg.items} "
          f"items, {wcfg.hours} h from {wcfg.start} UTC) to {', '.join(str(x) for x in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
