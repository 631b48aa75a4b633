"""What a damaged file lost, counted the way training counts it: against the index it had before.

A scan that meets a damaged record header skips to the next readable one; it cannot tell how
many records the skipped stretch held. The index the file had before the damage can:
training (``--skip-corrupt``) counts every record that index places in a damaged stretch as
lost (:func:`~evenflow.records.dataset_open.indexed_losses`), and ``evenflow index
--skip-corrupt`` counts the same way (:func:`earlier_losses`) when the file still has that
index. Without one, each damaged stretch counts as one record, with all its bytes.
"""
from __future__ import annotations

import os

import numpy as np

from evenflow.records.dataset_open import indexed_losses
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.idx_text import parse_idx
from evenflow.records.tfrecord.scan import ScanResult
from evenflow.records.sidecar import ShardIndex, idx_path, meta_path
from evenflow.util.files import NPZ_READ_ERRORS, read_npz


def _earlier_layout(path: str, file_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(offsets, lengths)`` of every record the earlier sidecars of ``path`` knew of (listed or left
    out as corrupt), when they tile a file of ``file_size`` bytes from byte 0; else None."""
    try:
        with open(idx_path(path), "rb") as f:
            offsets, lengths = parse_idx(f.read(), idx_path(path))
    except (OSError, RecordError):
        return None
    left_out = np.zeros(0, np.int64)
    if os.path.exists(meta_path(path)):
        try:
            left_out = np.asarray(read_npz(meta_path(path)).get("skipped_offset", left_out), np.int64).reshape(-1)
        except NPZ_READ_ERRORS:
            return None
    every = np.union1d(offsets, left_out)
    if every.size == 0 or every[0] != 0 or every[-1] >= file_size:
        return None
    sizes = np.diff(np.append(every, file_size))  # records tile the file: each runs to the next one
    if not np.array_equal(sizes[np.searchsorted(every, offsets)], lengths):
        return None
    return every, sizes


def earlier_losses(res: ScanResult) -> list[BadRecord] | None:
    """The records the file's earlier index knew of that the scan ``res`` could not keep, numbered and
    sized as training numbers and sizes them; None when the file has no earlier index that every
    record the scan kept fits (same offset, same length), or the scan lost nothing."""
    if not res.bad:
        return None
    layout = _earlier_layout(res.path, res.file_size)
    if layout is None:
        return None
    offsets, lengths = layout
    at = np.searchsorted(offsets, res.offsets)
    fits = (at < offsets.size) & (offsets[np.minimum(at, offsets.size - 1)] == res.offsets)
    if not fits.all() or not np.array_equal(lengths[at], res.lengths):
        return None
    keep = np.zeros(offsets.size, bool)
    keep[at] = True
    return indexed_losses(ShardIndex(res.path, offsets, lengths, res.file_size), keep, res.bad)
