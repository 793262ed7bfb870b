"""A synthetic impression world whose click probability is known: the demo's default log.

Requests show ``K`` items chosen by a logging policy (recent popularity, weak personalisation,
exploration); each shown item is clicked with a probability ``p`` that this module computes and
writes to a separate truth file, so an evaluation can report the NE of predicting ``p`` itself
(the Bayes NE), the floor under every model. ``p`` is built from effects of several kinds, each
visible to a different kind of model:

- taste: user taste . item latent. An item's latent is mostly its category and subcategory
  (``attribute_share``) plus its own part, so a new item is predictable from its attributes;
- long history: how much of the user's whole click history is in the candidate's category;
- session: the pull of the last item clicked in the same visit;
- freshness: young items are clicked more, old ones less;
- position: a logit penalty that grows with the slot; context: device and hour of day.

A conversion follows a click with a probability from a different function (its own user and
item latents and an item price level): the second label, ``conversion`` (0 without a click).

Users have skewed activity and come back within hours (one visit per user and hour, one to a few
requests per visit), so the pairs of the next hours are foreseeable from the last ones. Items are
born throughout the log and fade, so many items of a late hour were never seen early on.

Writes ``impressions.csv`` (request_id, user_id, item_id, ts in epoch ms, position, label,
conversion, surface, device, region, referrer), ``items.csv`` (item_id, category, subcategory)
and ``truth.csv`` (request_id, item_id, p_click, p_conversion). Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

IMPRESSIONS, ITEMS, TRUTH = "impressions.csv", "items.csv", "truth.csv"


@dataclass(frozen=True)
class WorldConfig:
    users: int = 3000
    items: int = 800
    hours: int = 48
    start: str = "2026-01-05T00:00:00"  # UTC
    visits_per_hour: float = 350.0  # at the daily mean; the cycle swings it +-60%
    requests_per_visit: float = 2.0  # mean; every visit has at least one
    shown: int = 10  # K items per request
    categories: int = 8
    subcategories: int = 4  # per category
    dim: int = 8  # latent dimension
    # logging policy: recent popularity, a little personalisation, some exploration
    policy_popularity: float = 1.0
    policy_taste: float = 0.5
    policy_explore: float = 0.15  # share of the shown slots filled uniformly at random
    # the click model: logit p = base + sum of the effects below
    base: float = -3.4
    taste: float = 1.6
    attribute_share: float = 0.7  # share of an item's latent that its category and subcategory decide
    quality: float = 0.5  # spread of the item's own quality
    long_history: float = 0.6  # weight of log(category share of the user's clicks / uniform share)
    session: float = 1.2  # pull of the last click in the visit
    freshness: float = 1.0  # bonus of a newborn item, fading with age
    freshness_hours: float = 12.0
    position: float = 0.35  # logit penalty per log(1 + slot)
    context: float = 0.25
    item_lifetime_hours: float = 96.0
    # conversion after a click
    conversion_base: float = -1.2
    conversion_taste: float = 1.5
    seed: int = 7

    def __post_init__(self):
        if min(self.users, self.items, self.hours, self.shown, self.categories, self.subcategories, self.dim) < 1:
            raise ValueError("users, items, hours, shown, categories, subcategories and dim must all be >= 1")
        if self.shown > self.items:
            raise ValueError(f"cannot show {self.shown} items per request out of {self.items}")
        if not 0 <= self.attribute_share <= 1 or not 0 <= self.policy_explore <= 1:
            raise ValueError("attribute_share and policy_explore must be in [0, 1]")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _unit_rows(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-9)


def _gumbel_top_k(scores: np.ndarray, k: int, rng) -> np.ndarray:
    """k distinct columns per row, drawn without replacement in proportion to exp(score), best first."""
    keys = scores + rng.gumbel(size=scores.shape)
    top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


class World:
    """The fixed parts of the world: users, items and their latent structure."""

    def __init__(self, cfg: WorldConfig):
        self.cfg = c = cfg
        rng = np.random.default_rng(c.seed)
        self.rng = rng
        n_sub = c.categories * c.subcategories
        cat_vec = _unit_rows(rng.normal(size=(c.categories, c.dim)))
        sub_vec = _unit_rows(cat_vec.repeat(c.subcategories, 0) + 0.6 * rng.normal(size=(n_sub, c.dim)))
        cat_share = rng.dirichlet(np.full(c.categories, 2.0))
        self.item_cat = rng.choice(c.categories, c.items, p=cat_share)
        self.item_sub = self.item_cat * c.subcategories + rng.integers(0, c.subcategories, c.items)
        own = _unit_rows(rng.normal(size=(c.items, c.dim)))
        a = c.attribute_share
        self.item_vec = _unit_rows(np.sqrt(a) * sub_vec[self.item_sub] + np.sqrt(1 - a) * own)
        self.item_quality = c.quality * rng.normal(size=c.items)
        self.item_birth = rng.uniform(-c.item_lifetime_hours / 2, c.hours, c.items)  # hours from start
        self.item_price = rng.normal(size=c.items)
        self.item_conv_vec = _unit_rows(rng.normal(size=(c.items, 4)))
        # Users like a few categories: taste is a mix of their centroids plus a personal part.
        self.user_pref = rng.dirichlet(np.full(c.categories, 0.3), c.users)
        self.user_vec = _unit_rows(self.user_pref @ cat_vec + 0.5 * rng.normal(size=(c.users, c.dim)) / np.sqrt(c.dim))
        self.user_activity = rng.lognormal(0.0, 1.2, c.users)
        self.user_device = rng.choice(3, c.users, p=[0.55, 0.35, 0.10])
        self.user_region = rng.integers(0, 12, c.users)
        self.user_conv_vec = _unit_rows(rng.normal(size=(c.users, 4)))
        self.user_buyer = rng.normal(scale=0.5, size=c.users)
        self.device_effect = np.array([0.0, -0.25, 0.3]) * c.context / 0.25

    def freshness(self, age_hours: np.ndarray) -> np.ndarray:
        return self.cfg.freshness * np.exp(-np.maximum(age_hours, 0) / self.cfg.freshness_hours)

    def hour_effect(self, hour_of_day: int) -> float:
        return self.cfg.context * np.sin(2 * np.pi * (hour_of_day - 20) / 24)


def generate(cfg: WorldConfig = WorldConfig()) -> dict[str, dict[str, np.ndarray]]:
    """{"impressions": columns, "items": columns, "truth": columns}, impressions sorted by time."""
    w = World(cfg)
    c, rng = cfg, w.rng
    start = datetime.fromisoformat(c.start).replace(tzinfo=timezone.utc)
    start_ms = int(start.timestamp() * 1000)
    n_cats = c.categories
    long_clicks = np.zeros((c.users, n_cats))  # every click so far, by category
    recent = np.zeros(c.items)  # clicks of the last hour: what the logging policy sees of popularity
    out: dict[str, list] = {k: [] for k in ("request", "user", "item", "ts", "position", "label", "conversion",
                                            "surface", "p_click", "p_conversion")}
    request_no = 0
    for h in range(c.hours):
        alive = np.flatnonzero((w.item_birth <= h + 0.5) & (w.item_birth > h + 0.5 - c.item_lifetime_hours))
        if alive.size < c.shown:
            continue
        age = h + 0.5 - w.item_birth[alive]
        cycle = 1 + 0.6 * np.sin(2 * np.pi * ((start.hour + h) % 24 - 9) / 24)
        n_visits = min(rng.poisson(c.visits_per_hour * cycle), c.users)
        if n_visits == 0:
            continue
        # One visit per user and hour, so a user's requests are in time order across visits.
        users = _gumbel_top_k(np.log(w.user_activity)[None, :], n_visits, rng)[0]
        n_req = 1 + rng.poisson(c.requests_per_visit - 1, n_visits)
        visit_start = rng.uniform(0, 3_600_000 - 600_000, n_visits)
        hour_effect = w.hour_effect((start.hour + h) % 24)
        taste = w.user_vec[users] @ w.item_vec[alive].T  # (V, A)
        policy = (c.policy_popularity * np.log1p(recent[alive]) + 0.5 * np.log1p(np.maximum(24 - age, 0))
                  + c.policy_taste * taste)
        static = (c.base + c.taste * taste + w.item_quality[alive] + w.freshness(age)
                  + w.device_effect[w.user_device[users]][:, None] + hour_effect)
        last = np.full(n_visits, -1)  # the visit's last clicked item (index into alive)
        new_recent = np.zeros(c.items)
        for k in range(int(n_req.max())):
            act = np.flatnonzero(n_req > k)
            n_explore = rng.binomial(c.shown, c.policy_explore)
            shown = _gumbel_top_k(policy[act], c.shown, rng)
            if n_explore:  # replace the lowest slots with uniformly drawn items not already shown
                noise = rng.random((act.size, alive.size))
                np.put_along_axis(noise, shown, 2.0, axis=1)
                shown[:, c.shown - n_explore:] = np.argsort(noise, axis=1)[:, :n_explore]
            u = users[act]
            share = (long_clicks[u] + 1.0) / (long_clicks[u].sum(1, keepdims=True) + n_cats)  # (a, C)
            cat = w.item_cat[alive[shown]]  # (a, K)
            logit = (np.take_along_axis(static[act], shown, axis=1)
                     + c.long_history * np.log(np.take_along_axis(share, cat, axis=1) * n_cats)
                     - c.position * np.log1p(np.arange(c.shown))[None, :])
            has_last = last[act] >= 0
            if has_last.any():
                prev = w.item_vec[alive[last[act][has_last]]]  # (b, D)
                logit[has_last] += c.session * np.einsum("bd,bkd->bk", prev, w.item_vec[alive[shown[has_last]]])
            p = _sigmoid(logit)
            click = rng.random(p.shape) < p
            items = alive[shown]
            conv_logit = (c.conversion_base + c.conversion_taste * np.einsum(
                "ad,akd->ak", w.user_conv_vec[u], w.item_conv_vec[items])
                - 0.5 * w.item_price[items] + w.user_buyer[u][:, None])
            p_conv = _sigmoid(conv_logit)
            conv = click & (rng.random(p.shape) < p_conv)
            # state after the request: its clicks join the long history and the session
            np.add.at(long_clicks, (np.repeat(u, c.shown)[click.ravel()], cat.ravel()[click.ravel()]), 1.0)
            np.add.at(new_recent, items[click], 1.0)
            clicked_any = click.any(axis=1)
            best = np.argmax(np.where(click, p, -1.0), axis=1)  # the most likely of its clicks
            last[act[clicked_any]] = shown[clicked_any, best[clicked_any]]
            ts = start_ms + h * 3_600_000 + (visit_start[act] + k * 90_000).astype(np.int64)
            out["request"].append(np.repeat(request_no + np.arange(act.size), c.shown))
            request_no += act.size
            out["user"].append(np.repeat(u, c.shown))
            out["item"].append(items.ravel())
            out["ts"].append(np.repeat(ts, c.shown))
            out["position"].append(np.tile(np.arange(c.shown), act.size))
            out["label"].append(click.ravel().astype(np.int8))
            out["conversion"].append(conv.ravel().astype(np.int8))
            out["surface"].append(np.full(act.size * c.shown, 1 if k == 0 else 2))
            out["p_click"].append(p.ravel())
            out["p_conversion"].append((p * p_conv).ravel())
        recent = new_recent
    cols = {k: np.concatenate(v) if v else np.array([], dtype=np.int64) for k, v in out.items()}
    order = np.lexsort((cols["position"], cols["request"], cols["ts"]))
    cols = {k: v[order] for k, v in cols.items()}
    request_id = np.char.add("r", cols["request"].astype(str))
    user_id = np.char.add("u", cols["user"].astype(str))
    item_id = np.char.add("i", cols["item"].astype(str))
    impressions = {"request_id": request_id, "user_id": user_id, "item_id": item_id, "ts": cols["ts"],
                   "position": cols["position"], "label": cols["label"], "conversion": cols["conversion"],
                   "surface": cols["surface"], "device": w.user_device[cols["user"]],
                   "region": w.user_region[cols["user"]], "referrer": rng.integers(1, 5, len(cols["ts"]))}
    items = {"item_id": np.char.add("i", np.arange(c.items).astype(str)),
             "category": np.char.add("c", w.item_cat.astype(str)),
             "subcategory": np.char.add("s", w.item_sub.astype(str))}
    truth = {"request_id": request_id, "item_id": item_id, "p_click": cols["p_click"],
             "p_conversion": cols["p_conversion"]}
    return {"impressions": impressions, "items": items, "truth": truth}


def add_arguments(parser) -> None:
    """The world's size flags, the same on every entry point that generates it."""
    d = WorldConfig()
    g = parser.add_argument_group("synthetic world size (--data synthetic)")
    g.add_argument("--synthetic-users", type=int, default=d.users)
    g.add_argument("--synthetic-items", type=int, default=d.items)
    g.add_argument("--synthetic-hours", type=int, default=d.hours)
    g.add_argument("--synthetic-visits-per-hour", type=float, default=d.visits_per_hour)


def from_arguments(args) -> WorldConfig:
    return WorldConfig(users=args.synthetic_users, items=args.synthetic_items, hours=args.synthetic_hours,
                       visits_per_hour=args.synthetic_visits_per_hour)


def write(world: dict[str, dict[str, np.ndarray]], folder: str | Path) -> dict[str, Path]:
    """The three CSV files under ``folder``; returns their paths."""
    import pandas as pd

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"impressions": folder / IMPRESSIONS, "items": folder / ITEMS, "truth": folder / TRUTH}
    for key, path in paths.items():
        pd.DataFrame(world[key]).to_csv(path, index=False, float_format="%.6g")
    return paths
