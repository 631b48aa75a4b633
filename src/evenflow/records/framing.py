"""TFRecord framing: the writer, the sequential reader and the scan that builds an index.

A TFRecord file is a plain concatenation of records, each framed as
:mod:`evenflow.records.frame` describes (``length + 16`` bytes), with no file header,
footer or padding. Nothing in the file says where record *i* starts; that is what the
``.idx`` sidecar (:mod:`evenflow.records.sidecar`) is for, and :func:`scan_file` is how
one is built for a file written by someone else.

:class:`RecordWriter` writes to ``<name>.tmp-<pid>`` and renames onto ``<name>`` only when
closed without error, so a reader never sees a half-written file.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from evenflow.records.crc import masked_crc32c
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.frame import FOOTER_BYTES, FRAME_BYTES, HEADER_BYTES
from evenflow.records.frame import LENGTH as _Q
from evenflow.records.sidecar import write_sidecars

__all__ = ["HEADER_BYTES", "FOOTER_BYTES", "RecordWriter", "ScanResult", "iter_records",
           "open_mmap", "read_record", "scan_file"]

_I = struct.Struct("<I")
_QI = struct.Struct("<QI")


class RecordWriter:
    """Writes one TFRecord file, atomically, and optionally its sidecar index.

    Records go to ``<path>.tmp-<pid>``; :meth:`close` flushes, fsyncs and renames it onto
    ``path``, then writes ``<path>.idx`` (and ``<path>.meta.npz`` with labels/costs) when
    ``write_index`` is true. Used as a context manager, an exception inside the block
    removes the temporary file and leaves ``path`` untouched.

    Args:
        path: the TFRecord file to create or replace.
        write_index: also write the sidecar index on close.
        fsync: fsync the data before the rename, so a crash cannot leave an empty file
            behind the final name.
    """

    def __init__(self, path, *, write_index: bool = True, fsync: bool = True):
        self.path = os.fspath(path)
        self.write_index = write_index
        self._fsync = fsync
        self._tmp = f"{self.path}.tmp-{os.getpid()}"
        self._file = open(self._tmp, "wb")
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._pos = 0
        self._closed = False
        self._headers: dict[int, bytes] = {}

    def write(self, data) -> int:
        """Append one record; returns its byte offset in the file."""
        if self._closed:
            raise ValueError(f"{self.path}: write() after close(); open a new RecordWriter")
        data = bytes(data) if not isinstance(data, bytes) else data
        n = len(data)
        header = self._headers.get(n)
        if header is None:  # lengths repeat a lot; their 12 header bytes are cached
            length = _Q.pack(n)
            header = length + _I.pack(masked_crc32c(length))
            if len(self._headers) < 65536:
                self._headers[n] = header
        self._file.write(b"".join((header, data, _I.pack(masked_crc32c(data)))))
        off = self._pos
        self._offsets.append(off)
        self._lengths.append(n + FRAME_BYTES)
        self._pos += n + FRAME_BYTES
        return off

    @property
    def num_records(self) -> int:
        return len(self._offsets)

    @property
    def offsets(self) -> np.ndarray:
        """Byte offset of each record written so far, int64 ``[n]``."""
        return np.asarray(self._offsets, dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Framed size of each record (data + 16), int64 ``[n]``."""
        return np.asarray(self._lengths, dtype=np.int64)

    def close(self, *, labels=None, costs=None) -> None:
        """Finish the file: flush, rename into place, write the sidecars.

        Args:
            labels: optional integer label per record, shape ``[n]``, for the sidecar.
            costs: optional non-negative cost per record, shape ``[n]``, for the sidecar.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        if self.write_index:
            write_sidecars(self.path, self.offsets, self.lengths, file_size=self._pos,
                           labels=labels, costs=costs)

    def abort(self) -> None:
        """Drop everything written; ``path`` is left as it was."""
        self._closed = True
        try:
            self._file.close()
        finally:
            try:
                os.remove(self._tmp)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_mmap(path) -> mmap.mmap | bytes:
    """Read-only map of a whole file (``b""`` for an empty file, which mmap refuses)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _check_header(buf, path, record: int, off: int, size: int) -> int:
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


def _check_data(buf, path, record: int, off: int, n: int) -> None:
    start = off + HEADER_BYTES
    (stored,) = _I.unpack_from(buf, start + n)
    computed = masked_crc32c(buf[start:start + n])
    if stored != computed:
        raise RecordError(path, f"corrupted data: data CRC is 0x{stored:08x}, computed 0x{computed:08x} "
                          f"over {n} bytes", record=record, offset=off, kind="data_crc")


def _resync(buf, size: int, start: int) -> int:
    """Next offset >= start where a header with a valid length CRC fits in the file, or size."""
    for q in range(start, size - HEADER_BYTES + 1):
        n, stored = _QI.unpack_from(buf, q)
        if n + FRAME_BYTES <= size - q and masked_crc32c(buf[q:q + 8]) == stored:
            return q
    return size


def read_record(buf, offset: int, *, path="<buffer>", record: int | None = None, verify: bool = True) -> bytes:
    """The data of the record that starts at ``offset`` in ``buf`` (a mmap or bytes).

    Raises:
        RecordError: truncated record or bad CRC, naming ``path``, ``record`` and ``offset``.
    """
    size = len(buf)
    n = _check_header(buf, path, record, offset, size)
    if verify:
        _check_data(buf, path, record, offset, n)
    start = offset + HEADER_BYTES
    return bytes(buf[start:start + n])


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


def _walk(path, buf, *, verify_data: bool, skip_corrupt: bool, bad: list[BadRecord]):
    """Yield ``(offset, data_length)`` of every good record, in file order."""
    size = len(buf)
    off = 0
    record = 0
    while off < size:
        try:
            n = _check_header(buf, path, record, off, size)
        except RecordError as e:
            if not skip_corrupt:
                raise
            bad.append(BadRecord(os.fspath(path), record, off, e.reason, e.kind))
            if e.kind != "length_crc":
                return  # truncated: nothing after this point
            off = _resync(buf, size, off + 1)
            record += 1
            continue
        if verify_data:
            try:
                _check_data(buf, path, record, off, n)
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
        fast = _scan_uniform(buf, size)
        if fast is not None:
            offsets, lengths = fast
            end = size
        else:
            offsets, end = _quick_offsets(buf, size)
            lengths = np.diff(np.append(offsets, end))
        bad_head = _first_bad_header(buf, offsets) if fast is None else -1
        if bad_head >= 0 or end != size:
            if not skip_corrupt:
                # Re-check the first suspicious record properly to raise its exact error.
                i = bad_head if bad_head >= 0 else offsets.size - 1 if end > size else offsets.size
                off = int(offsets[i]) if i < offsets.size else int(offsets[-1] + lengths[-1]) if offsets.size else 0
                _check_header(buf, path, i, off, size)
                raise RecordError(path, "malformed record framing", record=i, offset=off,
                                  kind="truncated")  # pragma: no cover - _check_header raised
            bad: list[BadRecord] = []
            walked = list(_walk(path, buf, verify_data=verify, skip_corrupt=True, bad=bad))
            offsets = np.asarray([o for o, _ in walked], dtype=np.int64)
            lengths = np.asarray([n for _, n in walked], dtype=np.int64) + FRAME_BYTES
            return ScanResult(path, offsets, lengths, size, bad)
        bad = []
        if verify:
            wrong = _data_crc_mismatches(buf, offsets, lengths)
            if wrong.size:
                i = int(wrong[0])
                if not skip_corrupt:
                    _check_data(buf, path, i, int(offsets[i]), int(lengths[i]) - FRAME_BYTES)
                for i in wrong.tolist():
                    try:
                        _check_data(buf, path, i, int(offsets[i]), int(lengths[i]) - FRAME_BYTES)
                    except RecordError as e:
                        bad.append(BadRecord(path, i, int(offsets[i]), e.reason, e.kind))
                keep = np.ones(offsets.size, bool)
                keep[wrong] = False
                offsets, lengths = offsets[keep], lengths[keep]
        return ScanResult(path, offsets, lengths, size, bad)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def iter_records(path, *, verify: bool = True, skip_corrupt: bool = False,
                 bad: list[BadRecord] | None = None) -> Iterator[bytes]:
    """Yield the data of every record of a TFRecord file, in order.

    Args:
        path: a TFRecord file.
        verify: check data CRCs (length CRCs are always checked).
        skip_corrupt: skip bad records instead of raising; they are appended to ``bad``.
        bad: list that receives the :class:`BadRecord` entries.
    """
    path = os.fspath(path)
    bad = [] if bad is None else bad
    buf = open_mmap(path)
    try:
        for off, n in _walk(path, buf, verify_data=verify, skip_corrupt=skip_corrupt, bad=bad):
            yield bytes(buf[off + HEADER_BYTES:off + HEADER_BYTES + n])
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
