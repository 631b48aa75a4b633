"""What makes a dataset the same dataset for a resumed run: its content, the keys read, the shape, the split.

A checkpoint stores the digest of the data it was trained on (``meta.json``'s ``data``), and a
run resumes only from checkpoints of the same digest: the same content (arrays, token
sequences, or a records dataset's index and per-record CRCs), the same feature and label keys,
the same per-sample shape, and the same held-out test set.
"""
from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["digest", "data_identity"]


def digest(*parts) -> str:
    """32 hex digits over numpy arrays, strings, numbers and None, in order."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, np.ndarray):
            arr = np.ascontiguousarray(part)
            h.update(f"array:{arr.dtype.str}{arr.shape}|".encode())
            h.update(arr.tobytes())
        else:
            h.update(f"{type(part).__name__}:{part!r}|".encode())
    return h.hexdigest()


def data_identity(content: str, feature_shape, split: dict, keys: tuple = ()) -> str:
    """The identity of a loaded dataset: its content digest, feature shape, keys and split."""
    return digest(content, tuple(feature_shape), tuple(keys), split["test_digest"], split["test_fraction"],
                  split["split_seed"])
