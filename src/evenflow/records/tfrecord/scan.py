"""The scan that finds every record of a TFRecord file: what an ``.idx`` sidecar is built from.

Nothing in a TFRecord file says where record *i* starts, so :func:`scan_file` follows
the length fields from byte 0. A file of equal-size records is checked in one vectorised
pass; any other well-formed file costs one tight loop over the length fields plus
vectorised CRC checks; only a damaged file scanned with ``skip_corrupt`` takes the
record-by-record walk of :mod:`evenflow.records.tfrecord.walk`.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from evenflow.records.tfrecord.crc import masked_crc32c
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.tfrecord.frame import FOOTER_BYTES, FRAME_BYTES, HEADER_BYTES
from evenflow.records.tfrecord.frame import LENGTH as _Q
from evenflow.records.tfrecord.walk import check_data, check_header, open_mmap, walk

_QI = struct.Struct("<QI")


@dataclass
class ScanResult:
    """Where the good records of one file are, and which ones were skipped.

    Attributes:
        path: the file scanned.
        offsets: byte offset of each good record, int64 ``[n]``.
        lengths: framed size of each good record (data + 16), int64 ``[n]``.
        file_size: size of the file in bytes.
        bad: records skipped as corrupt (only with ``skip_corrupt=True``).
    """

    path: str
    offsets: np.ndarray
    lengths: np.ndarray
    file_size: int
    bad: list[BadRecord] = field(default_factory=list)


def scan_file(path, *, verify: bool = False, skip_corrupt: bool = False) -> ScanResult:
    """Find every record of a TFRecord file, checking the framing as it goes.

    Every length CRC is checked (a wrong length would derail the scan); data CRCs are
    checked with ``verify=True``. A well-formed file is scanned with one tight loop over
    the length fields plus vectorised checks (a million records in well under a
    second); only a damaged file with ``skip_corrupt`` takes the slow record-by-record
    walk that can resynchronise after a bad header.

    Args:
        path: a TFRecord file.
        verify: also check each record's data CRC (reads the whole file).
        skip_corrupt: collect bad records in ``ScanResult.bad`` and carry on (after a
            bad length, at the next offset where a valid header starts) instead of
            raising.

    Returns:
        A :class:`ScanResult` with offsets and framed lengths of the good records.

    Raises:
        RecordError: truncated file or CRC mismatch, naming the record and offset.
    """
    path = os.fspath(path)
    buf = open_mmap(path)
    try:
        size = len(buf)
        offsets, lengths, end, bad_head = _follow_lengths(buf, size)
        if bad_head >= 0 or end != size:
            if not skip_corrupt:
                _raise_framing_error(buf, path, offsets, lengths, bad_head, end)
            return _scan_by_walking(buf, path, verify)
        bad: list[BadRecord] = []
        if verify:
            offsets, lengths, bad = _drop_bad_data(buf, path, offsets, lengths, skip_corrupt)
        return ScanResult(path, offsets, lengths, size, bad)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def _follow_lengths(buf, size: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The records the length fields lead to, unchecked but for their length CRCs.

    Returns:
        ``(offsets int64 [n], framed lengths int64 [n], end, bad_head)``: ``end`` is where
        the chain of length fields ended (``size`` for a well-formed file), ``bad_head``
        the first record whose length CRC is wrong, or -1.
    """
    uniform = _scan_uniform(buf, size)
    if uniform is not None:
        offsets, lengths = uniform
        return offsets, lengths, size, -1
    offsets, end = _quick_offsets(buf, size)
    lengths = np.diff(np.append(offsets, end))
    return offsets, lengths, end, _first_bad_header(buf, offsets)


def _raise_framing_error(buf, path: str, offsets: np.ndarray, lengths: np.ndarray, bad_head: int, end: int) -> NoReturn:
    """Re-check the first suspicious record properly to raise its exact error."""
    size = len(buf)
    i = bad_head if bad_head >= 0 else offsets.size - 1 if end > size else offsets.size
    off = int(offsets[i]) if i < offsets.size else int(offsets[-1] + lengths[-1]) if offsets.size else 0
    check_header(buf, path, i, off, size)
    raise RecordError(path, "malformed record framing", record=i, offset=off,
                      kind="truncated")  # pragma: no cover - check_header raised


def _scan_by_walking(buf, path: str, verify: bool) -> ScanResult:
    """Scan a damaged file record by record, leaving out (and listing) the bad ones."""
    bad: list[BadRecord] = []
    walked = list(walk(path, buf, verify_data=verify, skip_corrupt=True, bad=bad))
    offsets = np.asarray([o for o, _ in walked], dtype=np.int64)
    lengths = np.asarray([n for _, n in walked], dtype=np.int64) + FRAME_BYTES
    return ScanResult(path, offsets, lengths, len(buf), bad)


def _drop_bad_data(buf, path: str, offsets: np.ndarray, lengths: np.ndarray,
                   skip_corrupt: bool) -> tuple[np.ndarray, np.ndarray, list[BadRecord]]:
    """Check every data CRC; without ``skip_corrupt`` raise on the first bad one, else leave them out.

    Returns:
        ``(offsets, lengths, bad)`` of the records whose data CRC holds, and those left out.
    """
    bad: list[BadRecord] = []
    wrong = _data_crc_mismatches(buf, offsets, lengths)
    if wrong.size:
        i = int(wrong[0])
        if not skip_corrupt:
            check_data(buf, path, i, int(offsets[i]), int(lengths[i]) - FRAME_BYTES)
        for i in wrong.tolist():
            try:
                check_data(buf, path, i, int(offsets[i]), int(lengths[i]) - FRAME_BYTES)
            except RecordError as e:
                bad.append(BadRecord(path, i, int(offsets[i]), e.reason, e.kind, int(lengths[i])))
        keep = np.ones(offsets.size, bool)
        keep[wrong] = False
        offsets, lengths = offsets[keep], lengths[keep]
    return offsets, lengths, bad


def _scan_uniform(buf, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Fast path for files whose records all have the size of the first one.

    Checks every length field and every length CRC in bulk; returns None when the
    file is not uniform, so the caller falls back to the record-by-record walk.
    """
    if size < HEADER_BYTES:
        return None
    n0, crc0 = _QI.unpack_from(buf, 0)
    frame = n0 + FRAME_BYTES
    if frame > size or size % frame or masked_crc32c(buf[0:8]) != crc0:
        return None
    count = size // frame
    # A [count, frame] view of the file: column 0..11 is every record's header.
    heads = np.frombuffer(buf, dtype=np.uint8).reshape(count, frame)[:, :HEADER_BYTES]
    # Equal length fields imply equal length CRCs; both are compared byte for byte.
    uniform = bool((heads == heads[0]).all())
    del heads  # release the buffer export before the caller closes the map
    if not uniform:
        return None
    offsets = np.arange(count, dtype=np.int64) * frame
    return offsets, np.full(count, frame, dtype=np.int64)


def _quick_offsets(buf, size: int) -> tuple[np.ndarray, int]:
    """Follow the length fields from offset 0 without checking anything.

    Returns the offsets of every header that fits in the file, and where the chain
    ended (``size`` for a well-formed file). The tightest Python loop there is: one
    unpack and one add per record.
    """
    offs: list[int] = []
    append = offs.append
    unpack = _Q.unpack_from
    off = 0
    limit = size - HEADER_BYTES
    while off <= limit:
        append(off)
        off += unpack(buf, off)[0] + FRAME_BYTES
    return np.asarray(offs, dtype=np.int64), off


def _gather_fields(buf, positions: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """The little-endian integer of ``width`` bytes at each position, in bounded chunks."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    out = np.empty(positions.size, dtype=dtype)
    step = 1 << 18
    for lo in range(0, positions.size, step):
        part = positions[lo:lo + step]
        out[lo:lo + part.size] = arr[part[:, None] + np.arange(width)].view(dtype).reshape(-1)
    del arr  # release the export of buf
    return out


def _first_bad_header(buf, offsets: np.ndarray) -> int:
    """Index of the first record whose length CRC is wrong, or -1.

    Only the distinct length values are CRC'd (by google-crc32c): files of fixed-size
    features have few of them, so a million headers cost a few thousand CRC calls plus
    numpy; at worst (all lengths distinct) it is one call per record.
    """
    if offsets.size == 0:
        return -1
    lens = _gather_fields(buf, offsets, 8, "<u8")
    stored = _gather_fields(buf, offsets + 8, 4, "<u4")
    uniq, inverse = np.unique(lens, return_inverse=True)
    crcs = np.array([masked_crc32c(_Q.pack(int(v))) for v in uniq.tolist()], dtype=np.uint32)
    wrong = np.flatnonzero(crcs[inverse.reshape(-1)] != stored)
    return int(wrong[0]) if wrong.size else -1


def _data_crc_mismatches(buf, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions (into ``offsets``) of records whose data CRC is wrong."""
    if offsets.size == 0:
        return np.zeros(0, np.int64)
    foot = _gather_fields(buf, offsets + lengths - FOOTER_BYTES, 4, "<u4")
    crc = masked_crc32c
    computed = np.fromiter((crc(buf[o + HEADER_BYTES:o + n - FOOTER_BYTES])
                            for o, n in zip(offsets.tolist(), lengths.tolist())), dtype=np.uint32, count=offsets.size)
    return np.flatnonzero(computed != foot)
