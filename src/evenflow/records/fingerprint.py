"""What a shard's sidecars say about the file they describe, so that they can be refused when stale.

Every TFRecord frame ends with the masked CRC-32C of its data. Those stored CRCs, read by
offset (4 bytes a record, without reading the data), are a cheap fingerprint of the records:
rewriting a record, even at the same size with only its label changed, changes its CRC.
``<shard>.meta.npz`` keeps two of them (see :mod:`evenflow.records.sidecar`):

* the stored CRCs of a **sample** of the records (:func:`sample_positions`: the first, the
  last and an even spread, :data:`SAMPLE` + 2 in all; every record of a smaller shard),
  checked whenever the shard is opened: a bounded number of small reads, whatever the size
  of the shard;
* a **digest of every record's stored CRC** (:func:`crc_digest`), checked where every
  record is read anyway (``check="headers"`` / ``"crc"``, and at the start of training).

The digests here are blake2b, 32 hex digits.
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from evenflow.records.tfrecord.frame import FOOTER_BYTES
from evenflow.util.digests import arrays_checksum

SAMPLE = 64  # records spread over a shard between its first and its last, whose CRCs every open checks
_CHUNK = 1 << 18  # records per vectorised footer read: bounded temporaries for millions of records


class Fingerprint(NamedTuple):
    """The content of a shard as its sidecars recorded it.

    Attributes:
        sample_record: positions in the index of the sampled records, int64 ``[k]``.
        sample_crc: their stored data CRCs, uint32 ``[k]``.
        crc_digest: digest of every indexed record's stored data CRC, in index order.
    """

    sample_record: np.ndarray
    sample_crc: np.ndarray
    crc_digest: str


def sample_positions(n: int) -> np.ndarray:
    """int64 ``[k]``: the index positions sampled in a shard of ``n`` records (all of them when
    ``n <= SAMPLE + 2``; none when ``n == 0``)."""
    if n <= 0:
        return np.zeros(0, np.int64)
    return np.unique(np.linspace(0, n - 1, min(n, SAMPLE + 2)).round().astype(np.int64))


def footer_crcs(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, which=None) -> np.ndarray:
    """uint32 ``[k]``: the stored data CRC of the records at index positions ``which`` (default all).

    Args:
        data: the shard file's bytes, uint8 (a view of its map).
        offsets, lengths: the index (record starts and framed lengths).
    """
    ends = offsets + lengths if which is None else offsets[which] + lengths[which]
    out = np.empty(ends.shape[0], np.uint32)
    for lo in range(0, ends.shape[0], _CHUNK):
        part = ends[lo:lo + _CHUNK] - FOOTER_BYTES
        out[lo:lo + part.shape[0]] = np.ascontiguousarray(data[part[:, None] + np.arange(FOOTER_BYTES)]) \
            .view("<u4").reshape(-1)
    return out


def crc_digest(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> str:
    """Digest of every record's stored data CRC, in index order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{offsets.shape[0]}|".encode())
    for lo in range(0, offsets.shape[0], _CHUNK):
        h.update(footer_crcs(data, offsets[lo:lo + _CHUNK], lengths[lo:lo + _CHUNK]).tobytes())
    return h.hexdigest()


def fingerprint(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> Fingerprint:
    """The :class:`Fingerprint` of the records ``offsets``/``lengths`` in ``data``."""
    which = sample_positions(offsets.shape[0])
    return Fingerprint(which, footer_crcs(data, offsets, lengths, which), crc_digest(data, offsets, lengths))


def bytes_digest(raw: bytes) -> str:
    """Digest of a file's bytes (the ``.idx`` text)."""
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def columns_checksum(cols: dict) -> str:
    """Digest of every column of a ``.meta.npz`` but ``checksum`` itself: names, dtypes, shapes, values."""
    return arrays_checksum(cols, "checksum")
