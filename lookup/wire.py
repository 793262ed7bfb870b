"""The lookup's binary answer format, shared by the server (lookup/serve.py) and the client
(lookup/client.py) so neither imports the other."""

from __future__ import annotations

import struct

import numpy as np

MAGIC = b"SLR1"
BINARY_TYPE = "application/octet-stream"


def encode_binary(embeddings: np.ndarray, tiers: np.ndarray) -> bytes:
    """16-byte header (b'SLR1', uint32 n, uint32 dim, uint32 0; little-endian), n uint8 tier codes
    (index into TIERS), zero padding to a multiple of 4, then n * dim float32 little-endian."""
    n, dim = embeddings.shape
    pad = (-n) % 4
    return b"".join([MAGIC, struct.pack("<III", n, dim, 0), tiers.astype(np.uint8).tobytes(), b"\0" * pad,
                     np.ascontiguousarray(embeddings, dtype="<f4").tobytes()])


def decode_binary(body: bytes) -> tuple[np.ndarray, np.ndarray]:
    if body[:4] != MAGIC:
        raise ValueError("not a SOLARIS binary lookup response")
    n, dim, _ = struct.unpack("<III", body[4:16])
    tiers = np.frombuffer(body, np.uint8, n, 16)
    start = 16 + n + (-n) % 4
    return np.frombuffer(body, "<f4", n * dim, start).reshape(n, dim), tiers
