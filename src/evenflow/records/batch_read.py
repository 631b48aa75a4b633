"""Reading a batch of records by sample id: the ids checked, the records copied into one buffer.

:func:`evenflow.util.ids.sample_ids` checks the ids of a batch, :func:`subset_ids` those of a
subset of the records. Record ``j`` of the batch lies at
``data_off[j]`` in shard ``shard[j]`` and goes to ``buffer[starts[j]:starts[j] + lengths[j]]``.
Two ways to get it there, chosen by the caller from the mean record size (see
``RecordDataset.read_batch_buffer``): :func:`copy_slices`, one slice copy per record, and
:func:`gather_bytes`, one vectorised byte gather per distinct shard, which wins for
records of a few dozen bytes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from evenflow.util.distinct import all_distinct


def subset_ids(ids, num_records: int) -> np.ndarray:
    """The ``ids`` of a subset of ``num_records`` records as int64 ``[n]``, checked as
    :class:`~evenflow.data.SubsetSource` checks its ids: distinct record numbers, at least one.

    Raises:
        ValueError: ids that are not a non-empty 1-D integer array, one out of ``0..num_records-1``
            (naming it), or one that repeats (naming it: its record would be read twice an epoch).
    """
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size < 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"ids must be a non-empty 1-D integer array, got {arr.dtype} of shape {arr.shape}")
    out = arr[(arr < 0) | (arr >= num_records)]
    if out.size:
        raise ValueError(f"ids must be record numbers in 0..{num_records - 1}, got {out[0]}")
    if not all_distinct(arr):
        x = np.sort(arr)
        raise ValueError(f"ids must be distinct record numbers, got {x[1:][x[1:] == x[:-1]][0]} more than once")
    return arr.astype(np.int64)


def copy_slices(maps: Sequence[np.ndarray], shard: np.ndarray, data_off: np.ndarray, lengths: np.ndarray,
                starts: np.ndarray, buffer: np.ndarray) -> None:
    """Copy each record into ``buffer`` as one slice of its shard's map.

    Args:
        maps: uint8 view of each shard file.
        shard: int ``[B]`` shard of each record.
        data_off: int64 ``[B]`` offset of each record's data in its shard.
        lengths: int64 ``[B]`` data length of each record.
        starts: int64 ``[B]`` where each record goes in ``buffer``.
        buffer: uint8 ``[sum(lengths)]``, filled in place.
    """
    for s, a, n, d in zip(shard.tolist(), data_off.tolist(), lengths.tolist(), starts.tolist()):
        buffer[d:d + n] = maps[s][a:a + n]


def gather_bytes(maps: Sequence[np.ndarray], shard: np.ndarray, data_off: np.ndarray, lengths: np.ndarray,
                 starts: np.ndarray, buffer: np.ndarray) -> None:
    """Fill ``buffer`` with one fancy index per distinct shard of a non-empty batch.

    Arguments as for :func:`copy_slices`.
    """
    total = buffer.size
    if (shard == shard[0]).all():
        # Source position of every output byte: record j's bytes start at data_off[j].
        src = np.repeat(data_off - starts, lengths) + np.arange(total, dtype=np.int64)
        buffer[:] = maps[int(shard[0])][src]
        return
    # Expand the records in shard order, so each shard's bytes are one contiguous
    # run of (dst, src) pairs: one gather per distinct shard, output stays in id order.
    order = np.argsort(shard, kind="stable")
    ln = lengths[order]
    dst = np.repeat(starts[order] - (np.cumsum(ln) - ln), ln) + np.arange(total, dtype=np.int64)
    src = dst + np.repeat((data_off - starts)[order], ln)
    sorted_shard = shard[order]
    cuts = np.flatnonzero(np.diff(sorted_shard)) + 1
    byte_cuts = np.concatenate([[0], np.cumsum(ln)[cuts - 1], [total]]).tolist()
    for g, s in enumerate(sorted_shard[np.concatenate([[0], cuts])].tolist()):
        lo, hi = byte_cuts[g], byte_cuts[g + 1]
        buffer[dst[lo:hi]] = maps[s][src[lo:hi]]
