"""Checking the frames of a batch read from memory-mapped shards, and naming the first bad record.

Each record's length field must be the index's length, and its length and data CRCs must
hold. The headers and footers are gathered per shard in one fancy index each, the length
CRCs are computed once per distinct length, and the data CRCs with one C call per record;
only the first bad record is then described in words.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from evenflow.records.tfrecord.crc import MASK_DELTA, masked_crc32c
from evenflow.records.tfrecord.crc import _value as crc_value  # CRC-32C of bytes, no checks
from evenflow.records.errors import RecordError
from evenflow.records.tfrecord.frame import HEADER_BYTES, LENGTH


def verify_batch(maps: Sequence[np.ndarray], shard: np.ndarray, offsets: np.ndarray, buffer: np.ndarray,
                 starts: np.ndarray, lengths: np.ndarray, where: Callable[[int], tuple[str, int, int]]) -> None:
    """Check the length field and the length and data CRCs of every record of a batch.

    Args:
        maps: uint8 view of each shard file.
        shard: int ``[B]`` shard of each record.
        offsets: int64 ``[B]`` offset of each record's frame in its shard.
        buffer: the records' data (uint8 array or ``bytes``), record ``j`` at
            ``buffer[starts[j]:starts[j] + lengths[j]]``.
        starts: int64 ``[B]``.
        lengths: int64 ``[B]`` data length of each record, from the index.
        where: batch position ``j`` -> ``(shard path, record number in shard, offset)``, for the error.

    Raises:
        RecordError: the first record whose length CRC, length field or data CRC is wrong.
    """
    heads, foots = _frame_ends(maps, shard, offsets, lengths)
    stored_len = heads[:, :8].copy().view("<u8").reshape(-1)
    stored_lcrc = heads[:, 8:].copy().view("<u4").reshape(-1)
    stored_dcrc = foots.view("<u4").reshape(-1)
    uniq, inv = np.unique(stored_len, return_inverse=True)
    len_crc = np.array([masked_crc32c(LENGTH.pack(int(v))) for v in uniq.tolist()], np.uint32)[inv.reshape(-1)]
    raw = buffer if isinstance(buffer, bytes) else buffer.tobytes()
    # Plain CRC-32C per record (one C call each), compared with the unmasked stored values in
    # numpy: the masking arithmetic in Python per record cost as much as the CRCs themselves.
    plain = np.fromiter(map(crc_value, map(raw.__getitem__, map(slice, starts.tolist(),
                                                                (starts + lengths).tolist()))),
                        dtype=np.uint32, count=starts.size)
    rot = (stored_dcrc.astype(np.uint64) - MASK_DELTA) & 0xFFFFFFFF
    stored_plain = ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF
    bad = (stored_len != lengths.astype(np.uint64)) | (len_crc != stored_lcrc) | (plain != stored_plain)
    if not bad.any():
        return
    j = int(np.flatnonzero(bad)[0])
    path, rec, off = where(j)
    if len_crc[j] != stored_lcrc[j]:
        raise RecordError(path, f"corrupted length: length CRC is 0x{int(stored_lcrc[j]):08x}, computed "
                          f"0x{int(len_crc[j]):08x}", record=rec, offset=off, kind="length_crc")
    if stored_len[j] != lengths[j]:
        raise RecordError(path, f"index does not match the file: header says {int(stored_len[j])} data bytes, "
                          f"index {int(lengths[j])}; rebuild it with `evenflow index {path}`", record=rec,
                          offset=off, kind="index")
    computed = masked_crc32c(raw[int(starts[j]):int(starts[j] + lengths[j])])
    raise RecordError(path, f"corrupted data: data CRC is 0x{int(stored_dcrc[j]):08x}, computed "
                      f"0x{computed:08x} over {int(lengths[j])} bytes", record=rec, offset=off,
                      kind="data_crc")


def _frame_ends(maps: Sequence[np.ndarray], shard: np.ndarray, offsets: np.ndarray,
                lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each record's header and footer bytes: uint8 ``[B, 12]`` and ``[B, 4]``, one gather per shard."""
    heads = np.empty((shard.size, HEADER_BYTES), np.uint8)
    foots = np.empty((shard.size, 4), np.uint8)
    for s in np.unique(shard).tolist():
        sel = np.flatnonzero(shard == s)
        heads[sel] = maps[s][offsets[sel][:, None] + np.arange(HEADER_BYTES)]
        foots[sel] = maps[s][(offsets[sel] + HEADER_BYTES + lengths[sel])[:, None] + np.arange(4)]
    return heads, foots
