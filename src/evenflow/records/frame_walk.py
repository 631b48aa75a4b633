"""Checking the frames of a mapped TFRecord file one by one, and walking a file frame by frame.

:func:`check_header` and :func:`check_data` check the frame at one offset (its length
field, length CRC and data CRC, as :mod:`evenflow.records.frame` lays them out) and raise
a :class:`~evenflow.records.errors.RecordError` naming the file, record and offset.
:func:`walk` follows a file from its first byte and can resynchronise after a damaged
header (:func:`resync`): the slow path that the sequential reader and a scan with
``skip_corrupt`` share.
"""
from __future__ import annotations

import mmap
import os
import struct

from evenflow.records.crc import masked_crc32c
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.frame import FRAME_BYTES, HEADER_BYTES

__all__ = ["check_data", "check_header", "open_mmap", "resync", "walk"]

_I = struct.Struct("<I")
_QI = struct.Struct("<QI")


def open_mmap(path) -> mmap.mmap | bytes:
    """Read-only map of a whole file (``b""`` for an empty file, which mmap refuses)."""
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
    """Next offset >= start where a header with a valid length CRC fits in the file, or size."""
    for q in range(start, size - HEADER_BYTES + 1):
        n, stored = _QI.unpack_from(buf, q)
        if n + FRAME_BYTES <= size - q and masked_crc32c(buf[q:q + 8]) == stored:
            return q
    return size


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
            bad.append(BadRecord(os.fspath(path), record, off, e.reason, e.kind))
            if e.kind != "length_crc":
                return  # truncated: nothing after this point
            off = resync(buf, size, off + 1)
            record += 1
            continue
        if verify_data:
            try:
                check_data(buf, path, record, off, n)
            except RecordError as e:
                if not skip_corrupt:
                    raise
                bad.append(BadRecord(os.fspath(path), record, off, e.reason, e.kind))
                off += n + FRAME_BYTES
                record += 1
                continue
        yield off, n
        off += n + FRAME_BYTES
        record += 1
