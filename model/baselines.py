"""Baselines every user understands, reported beside the VM on the same split: an FM win over a
weak VM shows as such when a model of item popularity alone or a plain matrix factorisation is
as good as the VM.

- **popularity**: the item's label rate in the training rows, shrunk towards the overall rate
  (``prior_rows`` pseudo-rows of it), the overall rate for an item the training rows lack. On a
  click log whose negatives are drawn in proportion to clicks it is close to the base rate, as
  it should be: there, popularity does not separate the labels.
- **matrix factorisation**: logit = b + b_user + b_item + <p_user, q_item> (+ the same per-slot
  bias the VM has), trained like the VM (id dropout trains the unknown id's row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from model.features import MAX_POSITION
from model.vm import drop_ids

POPULARITY, MF = "popularity (item rate in training)", "matrix factorisation (16-d)"
NAMES = (POPULARITY, MF)


def item_rate(train_items, train_labels, items, prior_rows: float = 20.0) -> np.ndarray:
    """The smoothed label rate of each of ``items`` in the training rows (module docstring)."""
    train = pd.DataFrame({"item": np.asarray(train_items, dtype=object), "y": np.asarray(train_labels, dtype=np.float64)})
    base = float(train["y"].mean()) if len(train) else 0.5
    per = train.groupby("item")["y"].agg(["sum", "count"])
    rate = (per["sum"] + prior_rows * base) / (per["count"] + prior_rows)
    return pd.Series(np.asarray(items, dtype=object)).map(rate).fillna(base).to_numpy(dtype=np.float32)


@dataclass(frozen=True)
class MFConfig:
    n_users: int
    n_items: int
    dim: int = 16
    id_dropout: float = 0.05


class MatrixFactorization(nn.Module):
    config_class = MFConfig

    def __init__(self, cfg: MFConfig):
        super().__init__()
        self.cfg = cfg
        self.user, self.item = nn.Embedding(cfg.n_users, cfg.dim), nn.Embedding(cfg.n_items, cfg.dim)
        self.user_bias, self.item_bias = nn.Embedding(cfg.n_users, 1), nn.Embedding(cfg.n_items, 1)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=0.01)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        self.bias = nn.Parameter(torch.zeros(1))
        self.position_bias = nn.Embedding(MAX_POSITION + 1, 1, padding_idx=0)

    def _ids(self, x: torch.Tensor) -> torch.Tensor:
        return drop_ids(x, self.cfg.id_dropout) if self.training and self.cfg.id_dropout > 0 else x

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        u, i = self._ids(b["user"]), self._ids(b["item"])
        logit = (self.bias + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1)
                 + (self.user(u) * self.item(i)).sum(-1))
        return logit + self.position_bias(b["position"]).squeeze(-1) if "position" in b else logit
