"""The foundation model (FM): target-aware sequence model whose last shared layer is the
user-item interaction embedding that SOLARIS transfers to the vertical model.

per request:   history (R, L) items + categories + recency -> transformer encoder -> (R, L, D)
per candidate: item id + category + subcategory (N, D); counters (N, K) -> (N, D)
               target attention from the candidate over its request's encoded history (N, D)
[user, candidate, attended, mean history, candidate*attended, counters, context] -> MLP trunk
-> interaction embedding (N, E)  ("last shared layer") -> click head (N,) + position bias

The history is encoded once per request (``req`` maps each candidate row to its request), not
once per candidate. The slot a candidate is shown in enters only as an additive bias on the click
logit, so the interaction embedding is the same whatever the slot: a precomputed embedding
serves a pair in any position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from model.features import COUNTERS, MAX_POSITION, RECENCY_BUCKETS


@dataclass(frozen=True)
class FMConfig:
    n_users: int
    n_items: int
    n_devices: int
    n_surfaces: int
    n_categories: int = 2
    n_subcategories: int = 2
    history_len: int = 50  # L: events strictly before the request
    horizon_hours: float = 720.0  # look-back of history and counters
    dim: int = 64  # D: id and sequence width
    heads: int = 4
    layers: int = 2  # transformer layers over the history
    trunk: int = 512  # hidden width of the shared MLP
    embedding_dim: int = 256  # E: the interaction embedding (last shared layer)
    dropout: float = 0.1


class TargetAttention(nn.Module):
    """Multi-head attention from each candidate (one query) over its request's encoded history.
    Keys and values are projected once per request, then gathered per candidate: the projection,
    the costly part, is not repeated for every candidate of a request."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        if d % heads:
            raise ValueError(f"dim {d} is not a multiple of heads {heads}")
        self.heads, self.dropout = heads, nn.Dropout(dropout)
        self.query, self.key_value, self.out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, cand: torch.Tensor, seq: torch.Tensor, pad: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
        n, (r, length, d), h = cand.shape[0], seq.shape, self.heads
        k, v = self.key_value(seq).view(r, length, 2, h, d // h).unbind(2)  # (R, L, H, d/H) each, once per request
        q = self.query(cand).view(n, h, d // h)  # (N, H, d/H)
        scores = torch.einsum("nhc,nlhc->nhl", q, k[req]) / math.sqrt(d // h)  # (N, H, L)
        weights = self.dropout(scores.masked_fill(pad[req][:, None, :], float("-inf")).softmax(-1))
        return self.out(torch.einsum("nhl,nlhc->nhc", weights, v[req]).reshape(n, d))  # (N, D)


class FoundationModel(nn.Module):
    """The built-in FM (model.interface): reads every input group."""

    config_class = FMConfig
    inputs = frozenset({"context", "attributes", "counters", "history"})

    def __init__(self, cfg: FMConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.user = nn.Embedding(cfg.n_users, d)
        self.item = nn.Embedding(cfg.n_items, d, padding_idx=0)
        self.category = nn.Embedding(cfg.n_categories, d, padding_idx=0)
        self.subcategory = nn.Embedding(cfg.n_subcategories, d, padding_idx=0)
        self.position = nn.Embedding(cfg.history_len, d)
        self.recency = nn.Embedding(RECENCY_BUCKETS, d, padding_idx=0)
        self.counters = nn.Sequential(nn.Linear(len(COUNTERS), d), nn.GELU())
        self.hour = nn.Embedding(24, d // 4)
        self.device = nn.Embedding(cfg.n_devices, d // 4)
        self.surface = nn.Embedding(cfg.n_surfaces, d // 4)
        layer = nn.TransformerEncoderLayer(d, cfg.heads, 4 * d, cfg.dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.target_attention = TargetAttention(d, cfg.heads, cfg.dropout)
        trunk_in = 6 * d + 3 * (d // 4)
        self.trunk = nn.Sequential(
            nn.Linear(trunk_in, cfg.trunk), nn.GELU(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.trunk, cfg.embedding_dim), nn.GELU(),
        )
        self.head = nn.Linear(cfg.embedding_dim, 1)
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)  # 0: slot unknown, no bias

    def encode_history(self, hist: torch.Tensor, hist_cat: torch.Tensor, hist_age: torch.Tensor):
        """(seq (R, L, D), padding mask (R, L), mean of the encoded history (R, D)); 0 = padding."""
        pad = hist == 0
        empty = pad.all(dim=1)  # users with no history: attend to one dummy slot instead of nothing
        pad = pad.clone()
        pad[empty, -1] = False
        pos = torch.arange(hist.shape[1], device=hist.device)
        tokens = self.item(hist) + self.category(hist_cat) + self.recency(hist_age) + self.position(pos)[None]
        seq = self.encoder(tokens, src_key_padding_mask=pad)  # (R, L, D)
        keep = (~pad).unsqueeze(-1).float()
        return seq, pad, (seq * keep).sum(1) / keep.sum(1).clamp(min=1.0)

    def user_vector(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The FM's user-only pass (R, 2D): user id embedding and encoded history, no candidate.
        KNN over it finds similar users even when they have no pair embeddings yet."""
        _, _, mean_hist = self.encode_history(b["hist"], b["hist_cat"], b["hist_age"])
        return torch.cat([self.user(b["user"]), mean_hist], dim=1)

    def embed(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The interaction embedding (N, E) of each (user, candidate) row."""
        seq, pad, mean_hist = self.encode_history(b["hist"], b["hist_cat"], b["hist_age"])  # once per request
        req = b["req"]  # (N,) row -> request
        cand = self.item(b["item"]) + self.category(b["category"]) + self.subcategory(b["subcategory"])  # (N, D)
        attended = self.target_attention(cand, seq, pad, req)  # (N, D)
        x = torch.cat([self.user(b["user"]), cand, attended, mean_hist[req], cand * attended,
                       self.counters(b["counters"]), self.hour(b["hour"]), self.device(b["device"]),
                       self.surface(b["surface"])], dim=1)
        return self.trunk(x)  # (N, E)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.embed(b)).squeeze(-1) + self.position_bias(b["position"]).squeeze(-1)  # (N,) logits
