"""Batch inference on pandas frames, as the Spark jobs call it inside ``mapInPandas``.

A model is loaded once per Python worker (``load_vm`` / ``load_fm_encoder`` are cached per path),
not once per row or batch. Inputs are raw ids; the vocabulary saved beside each model maps them,
with unseen ids going to the out-of-vocabulary bucket.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
from model import registry
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import PAD, Vocab
from model.fm import FMConfig, FoundationModel
from model.train import infer, sigmoid
from model.vm import VerticalModel, VMConfig


@functools.lru_cache(maxsize=4)
def load_vm(path: str) -> tuple[VerticalModel, Vocab]:
    p = Path(path)
    return registry.load(p, VerticalModel, VMConfig), Vocab.load(p / "vocab.json")


@functools.lru_cache(maxsize=4)
def load_fm_encoder(fm_path: str, ae_path: str) -> tuple[FoundationModel, EmbeddingAutoencoder, Vocab]:
    fm = registry.load(Path(fm_path), FoundationModel, FMConfig)
    ae = registry.load(Path(ae_path), EmbeddingAutoencoder, AEConfig)
    if ae.cfg.input_dim != fm.cfg.embedding_dim:
        raise registry.CheckpointMismatch(
            f"autoencoder {ae_path} takes {ae.cfg.input_dim}-d embeddings but FM {fm_path} makes {fm.cfg.embedding_dim}-d")
    return fm, ae, Vocab.load(Path(fm_path) / "vocab.json")


def _context(pdf: pd.DataFrame, vocab: Vocab) -> dict[str, np.ndarray]:
    return {"user": vocab.encode("user", pdf["user_id"]), "item": vocab.encode("item", pdf["item_id"]),
            "hour": pd.to_datetime(pdf["ts"]).dt.hour.to_numpy().astype(np.int64),
            "device": vocab.encode("device", pdf["device"]), "surface": vocab.encode("surface", pdf["surface"]),
            "label": np.zeros(len(pdf), dtype=np.float32)}


def _history(histories, vocab: Vocab, length: int) -> np.ndarray:
    """(N, L) item codes, oldest first, left-padded; the last ``length`` of each history.
    All histories are encoded in one vocabulary lookup, not one per row."""
    tails = [list(h)[-length:] if h is not None and len(h) else [] for h in histories]
    sizes = np.fromiter((len(t) for t in tails), np.int64, len(tails))
    hist = np.full((len(tails), length), PAD, dtype=np.int64)
    if sizes.sum():
        codes = vocab.encode("item", [x for t in tails for x in t])
        rows = np.repeat(np.arange(len(tails)), sizes)
        cols = length - np.repeat(sizes, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
        hist[rows, cols] = codes
    return hist


def vm_scores(pdf: pd.DataFrame, vm_path: str, batch_size: int = 4096) -> np.ndarray:
    """Click probability of each row (user_id, item_id, ts, device, surface) by the verifier VM."""
    vm, vocab = load_vm(vm_path)
    if vm.cfg.use_fm_embedding:
        raise ValueError(f"{vm_path} is a VM that reads FM embeddings; the verifier must not depend on them")
    return sigmoid(infer(vm, vm, _context(pdf, vocab), batch_size))


def fm_codes(pdf: pd.DataFrame, fm_path: str, ae_path: str, batch_size: int = 2048,
             device: str = "cpu") -> np.ndarray:
    """(N, C) float32 compressed interaction embeddings of rows with user_id, item_id, ts, device,
    surface and ``history`` (the user's item ids strictly before ts, oldest first)."""
    fm, ae, vocab = load_fm_encoder(fm_path, ae_path)
    x = _context(pdf, vocab)
    x["hist"] = _history(pdf["history"], vocab, fm.cfg.history_len)
    has_category = "category" in pdf and vocab.values["category"]
    x["category"] = vocab.encode("category", pdf["category"]) if has_category else np.zeros(len(pdf), dtype=np.int64)

    def encode(b):
        return ae.encode(fm.embed(b))

    ae.to(device).eval()  # infer() moves and evals the FM; the autoencoder must sit on the same device
    return infer(encode, fm, x, batch_size, device).astype(np.float32)


def fm_user_vectors(pdf: pd.DataFrame, fm_path: str, ae_path: str, batch_size: int = 4096,
                    device: str = "cpu") -> np.ndarray:
    """(N, 2D) float32 FM user-only vectors of rows with user_id and ``history`` (see FoundationModel.user_vector)."""
    fm, _, vocab = load_fm_encoder(fm_path, ae_path)
    x = {"user": vocab.encode("user", pdf["user_id"]), "hist": _history(pdf["history"], vocab, fm.cfg.history_len)}
    return infer(fm.user_vector, fm, x, batch_size, device).astype(np.float32)
