"""Bring your own FM and VM: two models shaped unlike the built-ins, plugged in through config alone.

- ``CrossNetworkFM``: a DCN-style foundation model (Wang et al., "Deep & Cross Network", 2017). It
  reads no history: the user, the item and its attributes, the counters and the context, crossed
  explicitly (``x_{l+1} = x_0 * (W x_l + b) + x_l``) beside a deep tower. Its interaction embedding
  is the layer both towers feed, its user vector the user id embedding.
- ``FactorizedVM``: a factorization-machine VM (Rendle, 2010): a bias per field value plus the
  pairwise dot products of the field embeddings, and a linear read of the served FM embedding.

Use them with (docs/models.md, "Bring your own FM and VM")::

    [models]
    fm_class = "examples.byo_models.CrossNetworkFM"
    fm_params = { cross_layers = 3 }
    vm_class = "examples.byo_models.FactorizedVM"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.features import COUNTERS, MAX_POSITION
from model.tiers import TIERS


@dataclass(frozen=True)
class CrossNetworkConfig:
    n_users: int
    n_items: int
    n_devices: int
    n_surfaces: int
    n_categories: int = 2
    n_subcategories: int = 2
    history_len: int = 1  # reads no history: kept because every FM config states it
    horizon_hours: float = 720.0  # how far back the counters reach
    dim: int = 16  # width of every field embedding
    cross_layers: int = 2
    deep: int = 64
    embedding_dim: int = 32  # the interaction embedding precompute stores (compressed)


class CrossNetworkFM(nn.Module):
    config_class = CrossNetworkConfig
    inputs = frozenset({"context", "attributes", "counters"})

    def __init__(self, cfg: CrossNetworkConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.user = nn.Embedding(cfg.n_users, d)
        self.item = nn.Embedding(cfg.n_items, d, padding_idx=0)
        self.category = nn.Embedding(cfg.n_categories, d, padding_idx=0)
        self.subcategory = nn.Embedding(cfg.n_subcategories, d, padding_idx=0)
        self.counters = nn.Linear(len(COUNTERS), d)
        self.hour = nn.Embedding(24, d)
        self.device = nn.Embedding(cfg.n_devices, d)
        self.surface = nn.Embedding(cfg.n_surfaces, d)
        width = 8 * d
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(cfg.cross_layers))
        self.deep = nn.Sequential(nn.Linear(width, cfg.deep), nn.ReLU(), nn.Linear(cfg.deep, cfg.deep), nn.ReLU())
        self.join = nn.Sequential(nn.Linear(width + cfg.deep, cfg.embedding_dim), nn.GELU())
        self.head = nn.Linear(cfg.embedding_dim, 1)
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)

    def embed(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        x0 = torch.cat([self.user(b["user"]), self.item(b["item"]), self.category(b["category"]),
                        self.subcategory(b["subcategory"]), self.counters(b["counters"]), self.hour(b["hour"]),
                        self.device(b["device"]), self.surface(b["surface"])], dim=1)  # (N, 8d)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.join(torch.cat([x, self.deep(x0)], dim=1))  # (N, E)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        logit = self.head(self.embed(b)).squeeze(-1)
        return logit + self.position_bias(b["position"]).squeeze(-1) if "position" in b else logit

    def user_vector(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.user(b["user"])


@dataclass(frozen=True)
class FactorizedVMConfig:
    n_users: int
    n_items: int
    n_devices: int
    n_surfaces: int
    factors: int = 8
    use_fm_embedding: bool = False
    fm_dim: int = 32


class FactorizedVM(nn.Module):
    config_class = FactorizedVMConfig

    def __init__(self, cfg: FactorizedVMConfig):
        super().__init__()
        self.cfg = cfg
        sizes = {"user": cfg.n_users, "item": cfg.n_items, "hour": 24, "device": cfg.n_devices, "surface": cfg.n_surfaces}
        self.factors = nn.ModuleDict({k: nn.Embedding(n, cfg.factors) for k, n in sizes.items()})
        self.bias = nn.ModuleDict({k: nn.Embedding(n, 1) for k, n in sizes.items()})
        self.fm_read = nn.Linear(cfg.fm_dim + len(TIERS), 1) if cfg.use_fm_embedding else None
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        v = torch.stack([emb(b[k]) for k, emb in self.factors.items()], dim=1)  # (N, F, k)
        pairwise = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)  # sum over field pairs of <v_i, v_j>
        logit = pairwise + sum(emb(b[k]).squeeze(-1) for k, emb in self.bias.items())
        if self.fm_read is not None:
            tier = nn.functional.one_hot(b["tier"], len(TIERS)).float()
            logit = logit + self.fm_read(torch.cat([b["fm"], tier], dim=1)).squeeze(-1)
        return logit + self.position_bias(b["position"]).squeeze(-1) if "position" in b else logit
