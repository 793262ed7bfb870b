"""The vertical model (VM): the small ranker on the serving path.

[user id, item id, context] (+ optional [compressed FM embedding, one-hot of its tier]) -> 2-layer MLP,
plus an additive bias per slot (position). The FM input is zeros with tier ``none`` where no
embedding was served, so the same model reads exact, fallback and missing embeddings alike. The
VM reads no history, no item attributes and no counters: those reach it only through the FM.

With ``session`` it also reads one online session feature, which no precomputed code can know: the
user's last click before the request (``last_item``) and how long ago it was (``last_age``, a
recency code: minutes ago, the same visit, reads differently from days ago). The age goes to the
MLP; the click adds to the logit a learned similarity of the candidate and the clicked item (rows of
a table of their own, so the id rows the rest of the VM reads are left alone), weighted by the age:
the pull of an item just clicked. A pair where either item is outside the vocabulary has no pull
(all unknown items read one row, which would make any two of them alike). Both come from the log
as of the request (``model.features.last_click_inputs``).

No row a test reads is untrained. A VM trained by SOLARIS reads the hour of day as a point on a
circle (``hour_encoding = "cyclic"``), so an hour absent from its training window is read between
its neighbours, not from a randomly initialised row; and it replaces a share ``id_dropout`` of the
user and item ids of each training batch with the unknown id, so the row every id outside its
vocabulary reads (new users, new items) is trained. The defaults rebuild checkpoints written before
either existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from model.features import MAX_POSITION, OOV, RECENCY_BUCKETS
from model.tiers import NONE as TIER_NONE  # noqa: F401  (the tier of a pair served nothing)
from model.tiers import TIERS

FEATURES = ("user", "item", "hour", "device", "surface")  # ids and context, in the order the MLP reads them


@dataclass(frozen=True)
class VMConfig:
    n_users: int
    n_items: int
    n_devices: int
    n_surfaces: int
    dim: int = 16  # id embedding width
    hidden: int = 64
    use_fm_embedding: bool = False
    fm_dim: int = 32  # C: the autoencoder's code size
    features: tuple[str, ...] = FEATURES  # which of FEATURES it reads (a consumer's ``features``)
    hour_encoding: str = "embedding"  # "cyclic": (sin, cos) of the hour -> linear; "embedding": a row per hour
    id_dropout: float = 0.0  # training only: share of user and item ids read as the unknown id
    session: bool = False  # also read the user's last click before the request and its age (last_item, last_age)


HOUR_ENCODINGS = ("embedding", "cyclic")
TRAINED = {"hour_encoding": "cyclic", "id_dropout": 0.05}  # what SOLARIS trains with (model.training)


def drop_ids(x: torch.Tensor, rate: float) -> torch.Tensor:
    """``x`` with a share ``rate`` of its known ids replaced by the unknown id: trains the row every
    id outside the vocabulary reads (training only; padding and unknown ids stay as they are)."""
    drop = (x > OOV) & (torch.rand(x.shape, device=x.device) < rate)
    return torch.where(drop, torch.full_like(x, OOV), x)


class VerticalModel(nn.Module):
    """The built-in VM (model.interface)."""

    config_class = VMConfig

    def __init__(self, cfg: VMConfig):
        super().__init__()
        self.cfg = cfg
        self.features = tuple(cfg.features)
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown or not self.features:
            raise ValueError(f"VM features must be a non-empty subset of {', '.join(FEATURES)}; got {list(cfg.features)}")
        if cfg.hour_encoding not in HOUR_ENCODINGS:
            raise ValueError(f"VM hour_encoding must be one of {', '.join(HOUR_ENCODINGS)}; got {cfg.hour_encoding!r}")
        if not 0.0 <= cfg.id_dropout < 1.0:
            raise ValueError(f"VM id_dropout must be in [0, 1); got {cfg.id_dropout}")
        sizes = {"user": (cfg.n_users, cfg.dim), "item": (cfg.n_items, cfg.dim), "hour": (24, 4),
                 "device": (cfg.n_devices, 4), "surface": (cfg.n_surfaces, 4)}
        for name in self.features:  # attribute names as before: checkpoints of every feature load unchanged
            cyclic = name == "hour" and cfg.hour_encoding == "cyclic"
            setattr(self, name, nn.Linear(2, sizes[name][1]) if cyclic else nn.Embedding(*sizes[name]))
        width = sum(sizes[name][1] for name in self.features)
        if cfg.session:
            self.last_age = nn.Embedding(RECENCY_BUCKETS, 4)
            self.session_item = nn.Embedding(cfg.n_items, cfg.dim)
            nn.init.normal_(self.session_item.weight, std=0.1)
            self.session_weight = nn.Embedding(RECENCY_BUCKETS, 1, padding_idx=0)  # 0: no last click, no pull
            nn.init.constant_(self.session_weight.weight[1:], 1.0)
            width += 4
        extra = cfg.fm_dim + len(TIERS) if cfg.use_fm_embedding else 0
        self.mlp = nn.Sequential(nn.Linear(width + extra, cfg.hidden), nn.ReLU(),
                                 nn.Linear(cfg.hidden, cfg.hidden // 2), nn.ReLU(), nn.Linear(cfg.hidden // 2, 1))
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)  # 0: slot unknown, no bias

    def _read(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "hour" and self.cfg.hour_encoding == "cyclic":
            angle = x.float() * (2 * math.pi / 24)
            return self.hour(torch.stack([torch.sin(angle), torch.cos(angle)], dim=1))  # (B, 4)
        if name in ("user", "item") and self.training and self.cfg.id_dropout > 0:
            x = drop_ids(x, self.cfg.id_dropout)
        return getattr(self, name)(x)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self._read(name, b[name]) for name in self.features]
        if self.cfg.session:
            parts.append(self.last_age(b["last_age"]))
        if self.cfg.use_fm_embedding:
            fm = b["fm"]  # (B, C); zeros where tier is none
            if fm.shape[1] != self.cfg.fm_dim:
                raise ValueError(f"FM embedding has dimension {fm.shape[1]}, the VM expects {self.cfg.fm_dim}")
            parts += [fm, nn.functional.one_hot(b["tier"], len(TIERS)).float()]
        logit = self.mlp(torch.cat(parts, dim=1)).squeeze(-1)  # (B,)
        if self.cfg.session:
            logit = logit + self.session_pull(b)
        return logit + self.position_bias(b["position"]).squeeze(-1) if "position" in b else logit

    def session_pull(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) what the last click adds to the logit: the learned similarity of the candidate and the
        clicked item, weighted by how long ago the click was. Ids outside the vocabulary share one
        row, so two different new items would look alike: a pair with an unknown (or no) item has none."""
        known = (b["item"] > OOV) & (b["last_item"] > OOV)
        similarity = (self.session_item(b["item"]) * self.session_item(b["last_item"])).sum(-1)
        return self.session_weight(b["last_age"]).squeeze(-1) * similarity * known
