"""TFRecord framing: the writer and the sequential reader.

A TFRecord file is a plain concatenation of records, each framed as
:mod:`evenflow.records.tfrecord.frame` describes (``length + 16`` bytes), with no file header,
footer or padding. Nothing in the file says where record *i* starts; that is what the
``.idx`` sidecar (:mod:`evenflow.records.sidecar`) is for, and :func:`scan_file`
(:mod:`evenflow.records.tfrecord.scan`, re-exported here) is how one is built for a file written
by someone else.

:class:`RecordWriter` writes to ``<name>.tmp-<pid>`` and renames onto ``<name>`` only when
closed without error, so a reader never sees a half-written file.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Iterator

import numpy as np

from evenflow.records.tfrecord.crc import masked_crc32c
from evenflow.records.errors import BadRecord
from evenflow.records.tfrecord.frame import FRAME_BYTES, HEADER_BYTES
from evenflow.records.tfrecord.frame import LENGTH as _Q
from evenflow.records.tfrecord.walk import check_data, check_header, open_mmap, walk
# Re-exported: scanning a file is part of the framing's interface.
from evenflow.records.sidecar import idx_path, meta_path, write_sidecars

_I = struct.Struct("<I")


class RecordWriter:
    """Writes one TFRecord file, atomically, and optionally its sidecar index.

    Records go to ``<path>.tmp-<pid>``; :meth:`close` flushes, fsyncs and renames it onto
    ``path``, then writes ``<path>.idx`` and ``<path>.meta.npz`` (with labels/costs) when
    ``write_index`` is true, and otherwise removes any that ``path`` had: they described the
    file just replaced. Used as a context manager, an exception inside the block removes the
    temporary file and leaves ``path`` and its sidecars untouched.

    Args:
        path: the TFRecord file to create or replace.
        write_index: also write the sidecar index on close (else remove an old one).
        fsync: fsync the data before the rename, so a crash cannot leave an empty file
            behind the final name.

    Raises:
        IsADirectoryError, FileNotFoundError: ``path`` is a folder, or its folder does not exist.
        TypeError: :meth:`write` given anything but bytes.
    """

    def __init__(self, path, *, write_index: bool = True, fsync: bool = True):
        self.path = os.fspath(path)
        self.write_index = write_index
        self._fsync = fsync
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path} is a folder; RecordWriter writes one file: pass a file path "
                                    f"inside it, e.g. {os.path.join(self.path, 'data-0.tfrecord')}")
        folder = os.path.dirname(self.path) or "."
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{self.path}: its folder {folder} does not exist (or is not a folder); "
                                    f"create it first")
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
        if not isinstance(data, (bytes, bytearray, memoryview)):
            # bytes(n) of an int would silently write n zero bytes.
            raise TypeError(f"{self.path}: write() takes one serialized record as bytes (e.g. "
                            f"evenflow.records.encode_example({{...}})), got {type(data).__name__}")
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
            return
        for side in (idx_path(self.path), meta_path(self.path)):  # they described the file just replaced
            try:
                os.remove(side)
            except FileNotFoundError:
                pass

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


def read_record(buf, offset: int, *, path="<buffer>", record: int | None = None, verify: bool = True) -> bytes:
    """The data of the record that starts at ``offset`` in ``buf`` (a mmap or bytes).

    Raises:
        RecordError: truncated record or bad CRC, naming ``path``, ``record`` and ``offset``.
    """
    size = len(buf)
    n = check_header(buf, path, record, offset, size)
    if verify:
        check_data(buf, path, record, offset, n)
    start = offset + HEADER_BYTES
    return bytes(buf[start:start + n])


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
        for off, n in walk(path, buf, verify_data=verify, skip_corrupt=skip_corrupt, bad=bad):
            yield bytes(buf[off + HEADER_BYTES:off + HEADER_BYTES + n])
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
