"""Checking the frames of a mapped TFRecord file one by one, and walking a file frame by frame.

:func:`check_header` and :func:`check_data` check the frame at one offset (its length
field, length CRC and data CRC, as :mod:`evenflow.records.tfrecord.frame` lays them out) and raise
a :class:`~evenflow.records.errors.RecordError` naming the file, record and offset.
:func:`walk` follows a file from its first byte and can resynchronise after a damaged
header (:func:`resync`): the slow path that the sequential reader and a scan with
``skip_corrupt`` share.
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from evenflow.records.tfrecord.crc import masked_crc32c
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.tfrecord.frame import FRAME_BYTES, HEADER_BYTES

_I = struct.Struct("<I")
_Q = struct.Struct("<Q")
_QI = struct.Struct("<QI")


def open_mmap(path) -> mmap.mmap | bytes:
    """Read-only map of a whole file (``b""`` for an empty file, which mmap refuses).

    Raises:
        RecordError: ``path`` is a folder.
    """
    if os.path.isdir(path):
        raise RecordError(path, f"is a folder, not a TFRecord file; pass its TFRecord files, e.g. "
                          f"{os.path.join(path, '*.tfrecord')}", kind="input")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def check_header(buf, path, record: int, off: int, size: int) -> int:
    """Validate the header of the record at ``off``; returns its data length."""
    left = size - off
    if left < HEADER_BYTES:
        raise RecordError(path, f"truncated file: {left} bytes left where a {HEADER_BYTES}-byte record "
                          f"header should be; the file was cut short", record=record, offset=off, kind="truncated")
    n, stored = _QI.unpack_from(buf, off)
    computed = masked_crc32c(buf[off:off + 8])
    if stored != computed:
        raise RecordError(path, f"corrupted length: length CRC is 0x{stored:08x}, computed 0x{computed:08x} "
                          f"for length field {n}", record=record, offset=off, kind="length_crc")
    if n + FRAME_BYTES > left:
        raise RecordError(path, f"truncated file: record says {n} data bytes (+16 framing) but only {left} "
                          f"bytes are left; the file was cut short", record=record, offset=off, kind="truncated")
    return n


def check_data(buf, path, record: int, off: int, n: int) -> None:
    """Check the data CRC of the record at ``off``, whose data is ``n`` bytes long."""
    start = off + HEADER_BYTES
    (stored,) = _I.unpack_from(buf, start + n)
    computed = masked_crc32c(buf[start:start + n])
    if stored != computed:
        raise RecordError(path, f"corrupted data: data CRC is 0x{stored:08x}, computed 0x{computed:08x} "
                          f"over {n} bytes", record=record, offset=off, kind="data_crc")


def resync(buf, size: int, start: int) -> int:
    """Next offset >= start where a header with a valid length CRC fits in the file, or size.

    Vectorised over chunks of the file: every position's length field and stored CRC are read
    at once, positions whose length cannot fit in the rest of the file are dropped, and the CRC
    is computed once per distinct remaining length (a zeroed stretch has one: 0). A stretch of
    damaged megabytes costs milliseconds, not a Python step per byte.
    """
    arr = np.frombuffer(buf, dtype=np.uint8)
    last = size - HEADER_BYTES  # the last position a header fits at
    q = start
    while q <= last:
        stop = min(q + _RESYNC_CHUNK, last + 1)
        found = _first_header(arr, size, q, stop)
        if found is not None:
            return found
        q = stop
    return size


_RESYNC_CHUNK = 1 << 22


def _first_header(arr: np.ndarray, size: int, q: int, stop: int) -> int | None:
    """The first position in ``[q, stop)`` where a readable record header starts, or None.

    Each position's length field and stored CRC are read through unaligned uint32 views of the
    map (no copy). A header's length fits in the rest of the file, so its upper 4 bytes are 0
    in any file under 4 GiB, and it is never 12 zero bytes (the CRC of length 0 is not 0):
    random and zeroed stretches are both dismissed without computing a CRC.
    """
    count = stop - q

    def u32(at: int) -> np.ndarray:
        return np.ndarray((count,), dtype="<u4", buffer=arr, offset=at, strides=(1,))

    low, high, stored = u32(q), u32(q + 4), u32(q + 8)
    if size < 1 << 32:
        pos = np.flatnonzero((high == 0) & ((low != 0) | (stored != 0)))
        lengths = low[pos].astype(np.uint64)
    else:
        pos = np.arange(count)
        lengths = low.astype(np.uint64) | (high.astype(np.uint64) << np.uint64(32))
    room = (size - FRAME_BYTES) - (q + pos)  # data bytes that fit after each position
    fits = np.flatnonzero((room >= 0) & (lengths <= np.maximum(room, 0).astype(np.uint64)))
    if fits.size == 0:
        return None
    uniq, inverse = np.unique(lengths[fits], return_inverse=True)
    expected = np.array([masked_crc32c(_Q.pack(int(v))) for v in uniq.tolist()], dtype=np.uint32)
    hit = np.flatnonzero(expected[inverse.reshape(-1)] == stored[pos[fits]])
    return q + int(pos[fits[hit[0]]]) if hit.size else None


def walk(path, buf, *, verify_data: bool, skip_corrupt: bool, bad: list[BadRecord]):
    """Yield ``(offset, data_length)`` of every good record, in file order."""
    size = len(buf)
    off = 0
    record = 0
    while off < size:
        try:
            n = check_header(buf, path, record, off, size)
        except RecordError as e:
            if not skip_corrupt:
                raise
            if e.kind != "length_crc":
                bad.append(BadRecord(os.fspath(path), record, off, e.reason, e.kind, size - off))
                return  # truncated: nothing after this point
            after = resync(buf, size, off + 1)
            bad.append(BadRecord(os.fspath(path), record, off, f"{e.reason}; {after - off:,} bytes up to the next "
                                 f"readable record header skipped", e.kind, after - off))
            off = after
            record += 1
            continue
        if verify_data:
            try:
                check_data(buf, path, record, off, n)
            except RecordError as e:
                if not skip_corrupt:
                    raise
                bad.append(BadRecord(os.fspath(path), record, off, e.reason, e.kind, n + FRAME_BYTES))
                off += n + FRAME_BYTES
                record += 1
                continue
        yield off, n
        off += n + FRAME_BYTES
        record += 1
