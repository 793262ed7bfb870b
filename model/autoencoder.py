"""Autoencoder that compresses the FM's interaction embedding (E) to the fixed size the VM and
the feature tables carry (C, default 32)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class AEConfig:
    input_dim: int = 256  # E: the FM's interaction embedding
    code_dim: int = 32  # C: what is stored per pair and fed to the VM
    hidden: int = 128


class EmbeddingAutoencoder(nn.Module):
    def __init__(self, cfg: AEConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = nn.Sequential(nn.Linear(cfg.input_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.code_dim))
        self.decoder = nn.Sequential(nn.Linear(cfg.code_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.input_dim))

    def encode(self, e: torch.Tensor) -> torch.Tensor:
        return self.encoder(e)  # (B, E) -> (B, C)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(e))  # (B, E) reconstruction
