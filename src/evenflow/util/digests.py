"""Digests of what evenflow writes and reads back: values in order, a file's named arrays, a JSON object.

Every layer seals its files with these (a records sidecar's columns, an audit segment, a
checkpoint's ``meta.json``, ``summary.json``), so one written value is checked the same way
wherever it is read. All are BLAKE2b, 32 hex digits.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np


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


def arrays_checksum(arrays: dict, skip: str = "checksum") -> str:
    """:func:`digest` of every array but ``skip``, name by name in sorted order (as read back from an
    ``.npz``: a scalar is a 0-d array)."""
    return digest(*(part for key in sorted(k for k in arrays if k != skip) for part in (key, np.asarray(arrays[key]))))


def json_digest(obj: dict, skip: str) -> str:
    """Digest of a JSON object's canonical text (sorted keys, no spaces) without its key ``skip``:
    the same for any spacing or key order a tool writes it back with."""
    text = json.dumps({k: v for k, v in obj.items() if k != skip}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
