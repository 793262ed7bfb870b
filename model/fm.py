"""The foundation model (FM): target-aware sequence model whose last shared layer is the
user-item interaction embedding that SOLARIS transfers to the vertical model.

history (B, L) -> item embeddings + positions -> transformer encoder (B, L, D)
candidate (B,) -> target attention over the encoded history (B, D)
[user, candidate, attended, mean history, candidate*attended, context] -> MLP trunk
-> interaction embedding (B, E)  ("last shared layer") -> click head (B,)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FMConfig:
    n_users: int
    n_items: int
    n_devices: int
    n_surfaces: int
    n_categories: int = 2
    history_len: int = 50  # L: events strictly before the request
    dim: int = 64  # D: id and sequence width
    heads: int = 4
    layers: int = 2  # transformer layers over the history
    trunk: int = 512  # hidden width of the shared MLP
    embedding_dim: int = 256  # E: the interaction embedding (last shared layer)
    dropout: float = 0.1


class FoundationModel(nn.Module):
    def __init__(self, cfg: FMConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.user = nn.Embedding(cfg.n_users, d)
        self.item = nn.Embedding(cfg.n_items, d, padding_idx=0)
        self.category = nn.Embedding(cfg.n_categories, d // 4)
        self.position = nn.Embedding(cfg.history_len, d)
        self.hour = nn.Embedding(24, d // 4)
        self.device = nn.Embedding(cfg.n_devices, d // 4)
        self.surface = nn.Embedding(cfg.n_surfaces, d // 4)
        layer = nn.TransformerEncoderLayer(d, cfg.heads, 4 * d, cfg.dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.target_attention = nn.MultiheadAttention(d, cfg.heads, dropout=cfg.dropout, batch_first=True)
        trunk_in = 5 * d + 4 * (d // 4)
        self.trunk = nn.Sequential(
            nn.Linear(trunk_in, cfg.trunk), nn.GELU(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.trunk, cfg.embedding_dim), nn.GELU(),
        )
        self.head = nn.Linear(cfg.embedding_dim, 1)

    def encode_history(self, hist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seq (B, L, D), padding mask (B, L), mean of the encoded history (B, D)); 0 = padding."""
        pad = hist == 0
        empty = pad.all(dim=1)  # users with no history: attend to one dummy slot instead of nothing
        pad = pad.clone()
        pad[empty, -1] = False
        pos = torch.arange(hist.shape[1], device=hist.device)
        seq = self.encoder(self.item(hist) + self.position(pos)[None], src_key_padding_mask=pad)  # (B, L, D)
        keep = (~pad).unsqueeze(-1).float()
        return seq, pad, (seq * keep).sum(1) / keep.sum(1).clamp(min=1.0)

    def user_vector(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The FM's user-only pass (B, 2D): user id embedding and encoded history, no candidate.
        KNN over it finds similar users even when they have no pair embeddings yet."""
        _, _, mean_hist = self.encode_history(b["hist"])
        return torch.cat([self.user(b["user"]), mean_hist], dim=1)

    def embed(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The interaction embedding (B, E) of each (user, candidate) pair."""
        seq, pad, mean_hist = self.encode_history(b["hist"])  # history (B, L), oldest first
        cand = self.item(b["item"])  # (B, D)
        attended, _ = self.target_attention(cand[:, None], seq, seq, key_padding_mask=pad)  # (B, 1, D)
        attended = attended[:, 0]
        x = torch.cat([self.user(b["user"]), cand, attended, mean_hist, cand * attended,
                       self.category(b["category"]), self.hour(b["hour"]), self.device(b["device"]),
                       self.surface(b["surface"])], dim=1)
        return self.trunk(x)  # (B, E)

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.embed(b)).squeeze(-1)  # (B,) logits
