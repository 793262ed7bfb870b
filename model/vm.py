"""The vertical model (VM): the small ranker on the serving path.

[user id, item id, context] (+ optional [compressed FM embedding, one-hot of its tier]) -> 2-layer MLP,
plus an additive bias per slot (position). The FM input is zeros with tier ``none`` where no
embedding was served, so the same model reads exact, fallback and missing embeddings alike. The
VM reads no history, no item attributes and no counters: those reach it only through the FM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.features import MAX_POSITION
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
        sizes = {"user": (cfg.n_users, cfg.dim), "item": (cfg.n_items, cfg.dim), "hour": (24, 4),
                 "device": (cfg.n_devices, 4), "surface": (cfg.n_surfaces, 4)}
        for name in self.features:  # attribute names as before: checkpoints of every feature load unchanged
            setattr(self, name, nn.Embedding(*sizes[name]))
        width = sum(sizes[name][1] for name in self.features)
        extra = cfg.fm_dim + len(TIERS) if cfg.use_fm_embedding else 0
        self.mlp = nn.Sequential(nn.Linear(width + extra, cfg.hidden), nn.ReLU(),
                                 nn.Linear(cfg.hidden, cfg.hidden // 2), nn.ReLU(), nn.Linear(cfg.hidden // 2, 1))
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)  # 0: slot unknown, no bias

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [getattr(self, name)(b[name]) for name in self.features]
        if self.cfg.use_fm_embedding:
            fm = b["fm"]  # (B, C); zeros where tier is none
            if fm.shape[1] != self.cfg.fm_dim:
                raise ValueError(f"FM embedding has dimension {fm.shape[1]}, the VM expects {self.cfg.fm_dim}")
            parts += [fm, nn.functional.one_hot(b["tier"], len(TIERS)).float()]
        logit = self.mlp(torch.cat(parts, dim=1)).squeeze(-1)  # (B,)
        return logit + self.position_bias(b["position"]).squeeze(-1) if "position" in b else logit
