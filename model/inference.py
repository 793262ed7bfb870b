"""Batch inference on pandas frames, as the Spark jobs call it inside ``mapInPandas``.

A model is loaded once per Python worker (``load_vm`` / ``load_fm_encoder`` are cached per path),
not once per row or batch. Inputs are raw ids and the raw counts the Spark jobs attach
(``spark_jobs/embed_pairs.py``); the vocabulary saved beside each model maps the ids, with unseen
ids going to the out-of-vocabulary bucket, and ``model.features`` turns counts into the same
inputs that training built. Rows of one user share a history: it is encoded once per user.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
from torch import nn

from model import registry
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import PAD, Vocab, counter_features, group_rows, micros, recency_code
from model.interface import BUILTIN_FM, BUILTIN_VM
from model.train import infer, sigmoid

# What the Spark jobs attach to each pair for the FM (besides user_id, item_id, ts, device, surface).
PAIR_COLUMNS = ("category", "subcategory", "clicks_1h", "clicks_24h", "age_hours", "user_category", "user_total",
                "history", "history_category", "history_ts")


@functools.lru_cache(maxsize=4)
def load_vm(path: str, allowed: frozenset[str] = frozenset({BUILTIN_VM})) -> tuple[nn.Module, Vocab]:
    """A VM version of a class ``allowed`` names (the config's ``allowed_classes``), and its vocabulary."""
    p = Path(path)
    return registry.load_declared(p, "vm", allowed), Vocab.load(p / "vocab.json")


@functools.lru_cache(maxsize=4)
def load_fm_encoder(fm_path: str, ae_path: str, allowed: frozenset[str] = frozenset({BUILTIN_FM})
                    ) -> tuple[nn.Module, EmbeddingAutoencoder, Vocab]:
    fm = registry.load_declared(Path(fm_path), "fm", allowed)
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


def _tails(lists, length: int, fill) -> np.ndarray:
    """(N, L) object array: the last ``length`` entries of each list, right-aligned, ``fill`` before."""
    out = np.full((len(lists), length), fill, dtype=object)
    for i, values in enumerate(lists):
        if values is not None and len(values):
            tail = list(values)[-length:]
            out[i, length - len(tail):] = tail
    return out


def history_inputs(heads: pd.DataFrame, vocab: Vocab, length: int) -> dict[str, np.ndarray]:
    """(R, L) history codes of rows with ``history``, ``history_category`` and ``history_ts``
    (the user's events in the look-back before ``ts``, oldest first), as training builds them."""
    items = _tails(heads["history"], length, None)
    cats = _tails(heads["history_category"], length, None)
    times = _tails(heads["history_ts"], length, None)
    present = pd.notna(items)
    hist = np.where(present, vocab.encode("item", items.ravel()).reshape(items.shape), PAD)
    hist_cat = np.where(present, vocab.encode("category", cats.ravel()).reshape(cats.shape), PAD)
    t = micros(heads["ts"])
    ev_t = np.zeros(items.shape, np.int64)
    if present.any():
        ev_t[present] = micros(pd.Series(times[present]))
    hist_age = np.where(present, recency_code(t[:, None] - ev_t), PAD)
    return {"hist": hist.astype(np.int64), "hist_cat": hist_cat.astype(np.int64), "hist_age": hist_age.astype(np.int64)}


def pair_inputs(pdf: pd.DataFrame, vocab: Vocab, history_len: int, groups=("context", "attributes", "counters", "history")
                ) -> dict[str, np.ndarray]:
    """FM inputs of pairs at one time per user, grouped by user: the input ``groups`` the FM reads
    (model.interface), from the columns the Spark jobs attached for them (``PAIR_COLUMNS``)."""
    x = _context(pdf, vocab)
    if "history" in groups:
        req, first = group_rows(pdf["user_id"])
        x.update(req=req, **history_inputs(pdf.iloc[first], vocab, history_len))
    if "attributes" in groups:
        x["category"] = vocab.encode("category", pdf["category"])
        x["subcategory"] = vocab.encode("subcategory", pdf["subcategory"])
    if "counters" in groups:
        x["counters"] = counter_features(pdf["clicks_1h"].fillna(0), pdf["clicks_24h"].fillna(0),
                                         pd.to_numeric(pdf["age_hours"], errors="coerce").to_numpy(np.float64),
                                         pdf["user_category"].fillna(0), pdf["user_total"].fillna(0))
    x["position"] = np.zeros(len(pdf), np.int64)  # a precomputed pair has no slot yet
    return x


def vm_scores(pdf: pd.DataFrame, vm_path: str, batch_size: int = 4096,
              allowed: frozenset[str] = frozenset({BUILTIN_VM})) -> np.ndarray:
    """Click probability of each row (user_id, item_id, ts, device, surface) by the verifier VM
    (slot unknown: no position bias)."""
    vm, vocab = load_vm(vm_path, allowed)
    if vm.cfg.use_fm_embedding:
        raise ValueError(f"{vm_path} is a VM that reads FM embeddings; the verifier must not depend on them")
    return sigmoid(infer(vm, vm, _context(pdf, vocab), batch_size))


def fm_codes(pdf: pd.DataFrame, fm_path: str, ae_path: str, batch_size: int = 2048,
             device: str = "cpu", allowed: frozenset[str] = frozenset({BUILTIN_FM})) -> np.ndarray:
    """(N, C) float32 compressed interaction embeddings of pairs with user_id, item_id, ts, device,
    surface and the ``PAIR_COLUMNS`` of the groups the FM reads."""
    fm, ae, vocab = load_fm_encoder(fm_path, ae_path, allowed)
    x = pair_inputs(pdf, vocab, fm.cfg.history_len, fm.inputs)

    def encode(b):
        return ae.encode(fm.embed(b))

    ae.to(device).eval()  # infer() moves and evals the FM; the autoencoder must sit on the same device
    return infer(encode, fm, x, batch_size, device).astype(np.float32)


def fm_user_vectors(pdf: pd.DataFrame, fm_path: str, ae_path: str, batch_size: int = 4096,
                    device: str = "cpu", allowed: frozenset[str] = frozenset({BUILTIN_FM}),
                    known_keys: np.ndarray | None = None, known_vectors=None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors (N, U) float32, input keys (N,) int64, fresh (N,) bool): the FM user-only vectors
    (the FM's ``user_vector``) of rows with user_id, ts and, for an FM that reads history, the
    history columns.

    A row's input key is a digest of exactly what the pass reads: the user's code and, per
    history slot, the item, category and recency codes. Where ``known_keys`` (a key per row from an
    earlier pass of this model, -1 or NaN for none) equals it, the row's ``known_vectors`` entry is
    returned as it is and the FM does not run on it (``fresh`` False): equal inputs, equal vector."""
    fm, _, vocab = load_fm_encoder(fm_path, ae_path, allowed)
    x = {"user": vocab.encode("user", pdf["user_id"]), "label": np.zeros(len(pdf), np.float32)}
    if "history" in fm.inputs:
        x.update(history_inputs(pdf, vocab, fm.cfg.history_len))
    keys = input_keys(np.column_stack([x[c] for c in ("user", "hist", "hist_cat", "hist_age") if c in x]))
    fresh = np.ones(len(pdf), bool)
    if known_keys is not None:
        fresh = pd.to_numeric(pd.Series(known_keys), errors="coerce").to_numpy() != keys
    parts = []
    if fresh.any():
        parts.append((fresh, infer(fm.user_vector, fm, {c: v[fresh] for c, v in x.items()}, batch_size, device)))
    if (~fresh).any():
        parts.append((~fresh, np.stack([np.asarray(v, np.float32) for v in np.asarray(known_vectors, dtype=object)[~fresh]])))
    out = np.zeros((len(pdf), parts[0][1].shape[1] if parts else 0), np.float32)
    for rows, v in parts:
        out[rows] = v
    return out, keys, fresh


def input_keys(codes: np.ndarray) -> np.ndarray:
    """(N,) int64: a 52-bit BLAKE2b digest of each row of an int64 code matrix. 52 bits, so that a
    key survives a trip through float64 (a nullable integer column read by pandas)."""
    import hashlib

    rows = np.ascontiguousarray(codes, dtype=np.int64)
    return np.fromiter((int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=7).digest(), "little") >> 4
                        for r in rows), np.int64, len(rows))
