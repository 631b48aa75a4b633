"""The sidecar index of a TFRecord shard: where each record is, and its label and cost.

Two files sit next to each shard ``<shard>``:

``<shard>.idx``
    Text, one line per record, ``"<offset> <length>\\n"`` in decimal: the byte offset of
    the record's start and its full framed size (data + 16 bytes of header and footer).
    This is exactly what NVIDIA DALI's ``tools/tfrecord2idx`` writes and what DALI's
    ``readers.TFRecord(index_path=...)`` reads, so DALI can use our indexes and we can
    use DALI's.

``<shard>.meta.npz`` (optional)
    ``np.savez`` columns, no pickled objects: ``file_size`` and ``num_records``
    (scalars, to detect a stale index), ``label`` (int64 ``[n]``) and ``cost`` (float64
    ``[n]``) when known, and ``skipped_record`` / ``skipped_offset`` for records that
    ``evenflow index --skip-corrupt`` left out.

The ``.idx`` text itself is read and written by :mod:`evenflow.records.idx_text`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.frame import FRAME_BYTES
from evenflow.records.idx_text import format_idx, parse_idx
from evenflow.util.files import NPZ_READ_ERRORS, read_npz

__all__ = ["ShardIndex", "idx_path", "kept_numbers", "load_shard_index", "meta_path", "parse_idx", "write_sidecars"]

META_VERSION = 1


def idx_path(shard) -> str:
    return os.fspath(shard) + ".idx"


def meta_path(shard) -> str:
    return os.fspath(shard) + ".meta.npz"


def _atomic_write(path: str, write) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise


def write_sidecars(shard, offsets, lengths, *, file_size: int, labels=None, costs=None,
                   skipped_records=None, skipped_offsets=None) -> None:
    """Write ``<shard>.idx`` and ``<shard>.meta.npz`` atomically.

    Args:
        shard: path of the TFRecord file.
        offsets: byte offset of each record, int ``[n]``.
        lengths: framed size of each record (data + 16), int ``[n]``.
        file_size: size of the shard in bytes.
        labels: optional int label per record ``[n]``.
        costs: optional float cost per record ``[n]``, >= 0.
        skipped_records, skipped_offsets: records left out as corrupt.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = offsets.shape[0]
    cols = {"format_version": np.int64(META_VERSION), "file_size": np.int64(file_size), "num_records": np.int64(n),
            "skipped_record": np.asarray(skipped_records if skipped_records is not None else [], dtype=np.int64),
            "skipped_offset": np.asarray(skipped_offsets if skipped_offsets is not None else [], dtype=np.int64)}
    for name, values, dtype in (("label", labels, np.int64), ("cost", costs, np.float64)):
        if values is None:
            continue
        arr = np.asarray(values)
        if arr.shape != (n,):
            raise ValueError(f"{shard}: {name} must have one entry per record, {n}, got shape {arr.shape}")
        cols[name] = arr.astype(dtype)
    text = format_idx(offsets, lengths)
    _atomic_write(idx_path(shard), lambda f: f.write(text))
    _atomic_write(meta_path(shard), lambda f: np.savez(f, **cols))


@dataclass
class ShardIndex:
    """The validated index of one shard.

    Attributes:
        path: the shard file.
        offsets: byte offset of each record, int64 ``[n]``.
        lengths: framed size of each record (data + 16), int64 ``[n]``.
        file_size: size of the shard on disk.
        labels: int64 ``[n]`` or None.
        costs: float64 ``[n]`` or None.
        skipped: number of records the index leaves out as corrupt.
        numbers: each indexed record's number in the file, int64 ``[n]``, when the index or
            an open dataset left corrupt records out (else None: its position).
    """

    path: str
    offsets: np.ndarray
    lengths: np.ndarray
    file_size: int
    labels: np.ndarray | None = None
    costs: np.ndarray | None = None
    skipped: int = 0
    numbers: np.ndarray | None = None

    @property
    def num_records(self) -> int:
        return int(self.offsets.shape[0])


def kept_numbers(n: int, skipped) -> np.ndarray | None:
    """The number in the file of each of the ``n`` records an index keeps when it left out the
    records numbered ``skipped`` (int64 ``[n]``), or None when it left none out."""
    skipped = np.unique(np.asarray(skipped, dtype=np.int64))
    if skipped.size == 0:
        return None
    return np.setdiff1d(np.arange(n + skipped.size, dtype=np.int64), skipped)[:n]


def _load_meta(path: str) -> dict:
    try:
        return read_npz(path)
    except NPZ_READ_ERRORS as e:
        shard = path[:-len(".meta.npz")] if path.endswith(".meta.npz") else "<shard>"
        raise RecordError(path, f"cannot read the index metadata ({type(e).__name__}: {e}); rebuild it with "
                          f"`evenflow index {shard} --label-key KEY [--cost-key KEY]` (the keys of the label and cost "
                          f"features, to store their columns again)", kind="index") from None


def load_shard_index(shard) -> ShardIndex:
    """Load and check the sidecars of one shard against the shard file.

    Checks that lengths are at least 16, records do not overlap, and the index covers
    the file: the last offset + length equals the file size and records are contiguous,
    unless the metadata lists skipped corrupt records (then the recorded file size must
    match instead).

    Raises:
        RecordError: missing index, unreadable index, or an index that does not match its
            file; the message names the file and what differs.
    """
    found = _read_sidecars(os.fspath(shard))
    if found.meta:
        _check_meta(found)
    skipped = int(found.meta["skipped_record"].shape[0]) if "skipped_record" in found.meta else 0
    if found.offsets.shape[0]:
        _check_lengths(found)
        if skipped == 0:
            _check_contiguous(found)
        else:
            _check_no_overlap(found)
    elif skipped == 0 and found.file_size != 0:
        raise found.mismatch(f"the index lists no records but the file has {found.file_size} bytes")
    labels = found.meta.get("label")
    costs = found.meta.get("cost")
    return ShardIndex(found.shard, found.offsets, found.lengths, found.file_size,
                      labels=None if labels is None else labels.astype(np.int64, copy=False),
                      costs=None if costs is None else costs.astype(np.float64, copy=False),
                      skipped=skipped,
                      numbers=kept_numbers(found.offsets.shape[0], found.meta.get("skipped_record", [])))


@dataclass
class _Sidecars:
    """The sidecars of one shard as read, and the size of the shard they describe."""

    shard: str
    ipath: str
    file_size: int
    offsets: np.ndarray
    lengths: np.ndarray
    meta: dict

    def mismatch(self, what: str, record=None, offset=None, kind="index") -> RecordError:
        return RecordError(self.shard, f"index {self.ipath} does not match the file: {what}; rebuild it with "
                           f"`evenflow index {self.shard}`", record=record, offset=offset, kind=kind)

    def cut_short(self, expected: int) -> RecordError:
        """The error for a file smaller than the ``expected`` bytes the index describes."""
        offsets, lengths, file_size, n = self.offsets, self.lengths, self.file_size, self.offsets.shape[0]
        over = np.flatnonzero(offsets + lengths > file_size)
        i = int(over[0]) if over.size else max(n - 1, 0)
        return self.mismatch(f"the file has {file_size} bytes but its index expects {expected}, so record {i} "
                             f"(ends at byte {int(offsets[i] + lengths[i]) if n else 0}) is cut short: the file "
                             f"was truncated", record=i, offset=int(offsets[i]) if n else 0, kind="truncated")


def _read_sidecars(shard: str) -> _Sidecars:
    """Read ``<shard>.idx`` and, when present, ``<shard>.meta.npz``; nothing is checked against the file yet."""
    ipath = idx_path(shard)
    try:
        file_size = os.stat(shard).st_size
    except FileNotFoundError as e:
        raise RecordError(shard, "no such record file", kind="input") from e
    if os.path.isdir(shard):
        raise RecordError(shard, f"is a folder, not a TFRecord file; pass its TFRecord files, e.g. "
                          f"{os.path.join(shard, '*.tfrecord')}", kind="input")
    try:
        with open(ipath, "rb") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise RecordError(shard, f"missing index {ipath}; build it with `evenflow index {shard}`",
                          kind="index") from e
    except IsADirectoryError as e:
        raise RecordError(shard, f"index {ipath} is a folder, not an index file; move it away and build the "
                          f"index with `evenflow index {shard}`", kind="index") from e
    except OSError as e:
        raise RecordError(shard, f"cannot read index {ipath} ({type(e).__name__}: {e.strerror})",
                          kind="index") from e
    offsets, lengths = parse_idx(text, ipath)
    meta = _load_meta(meta_path(shard)) if os.path.exists(meta_path(shard)) else {}
    return _Sidecars(shard, ipath, file_size, offsets, lengths, meta)


def _check_meta(found: _Sidecars) -> None:
    """The metadata's record count and file size agree with the index and the file."""
    n, file_size = found.offsets.shape[0], found.file_size
    if int(found.meta["num_records"]) != n:
        raise found.mismatch(f"{meta_path(found.shard)} says {int(found.meta['num_records'])} records, "
                             f"the index has {n}")
    built_for = int(found.meta["file_size"])
    if built_for > file_size:
        raise found.cut_short(built_for)
    if built_for != file_size:
        raise found.mismatch(f"the index was built for a file of {built_for} bytes, the file has {file_size} "
                             f"bytes; it was appended to or rewritten", offset=built_for)


def _check_lengths(found: _Sidecars) -> None:
    """Every record holds at least its framing, and the last one ends inside the file."""
    offsets, lengths = found.offsets, found.lengths
    short = np.flatnonzero(lengths < FRAME_BYTES)
    if short.size:
        i = int(short[0])
        raise found.mismatch(f"line {i + 1} gives length {lengths[i]}, less than the 16 bytes of framing",
                             record=i, offset=offsets[i])
    end = offsets[-1] + lengths[-1]
    if end > found.file_size:
        raise found.cut_short(int(end))


def _check_contiguous(found: _Sidecars) -> None:
    """An index without skipped records tiles the file: from byte 0, no gaps, to its last byte."""
    offsets, lengths, file_size = found.offsets, found.lengths, found.file_size
    ends = offsets + lengths
    if offsets[0] != 0:
        raise found.mismatch(f"first record starts at byte {offsets[0]}, not 0", record=0, offset=offsets[0])
    gaps = np.flatnonzero(offsets[1:] != ends[:-1])
    if gaps.size:
        i = int(gaps[0]) + 1
        raise found.mismatch(f"record {i} starts at byte {offsets[i]} but record {i - 1} ends at byte "
                             f"{ends[i - 1]}", record=i, offset=offsets[i])
    if ends[-1] != file_size:
        raise found.mismatch(f"index ends at byte {ends[-1]} (offset {offsets[-1]} + length {lengths[-1]}) "
                             f"but the file has {file_size} bytes")


def _check_no_overlap(found: _Sidecars) -> None:
    """An index that leaves corrupt records out may have gaps, but no record overlaps the next."""
    offsets, ends = found.offsets, found.offsets + found.lengths
    overlap = np.flatnonzero(offsets[1:] < ends[:-1])
    if overlap.size:
        i = int(overlap[0]) + 1
        raise found.mismatch(f"record {i} at byte {offsets[i]} overlaps record {i - 1}", record=i,
                             offset=offsets[i])


def write_meta_columns(shard, index: ShardIndex, *, labels=None, costs=None) -> None:
    """Rewrite ``<shard>.meta.npz`` with new label/cost columns, keeping the rest."""
    skipped = {}
    mp = meta_path(shard)
    if os.path.exists(mp):
        old = _load_meta(mp)
        skipped = {"skipped_records": old.get("skipped_record"), "skipped_offsets": old.get("skipped_offset")}
    write_sidecars(shard, index.offsets, index.lengths, file_size=index.file_size,
                   labels=labels if labels is not None else index.labels,
                   costs=costs if costs is not None else index.costs, **skipped)

