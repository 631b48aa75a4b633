"""The sidecar index of a TFRecord shard: where each record is, its label and cost, and what file it describes.

Two files sit next to each shard ``<shard>``:

``<shard>.idx``
    Text, one line per record, ``"<offset> <length>\\n"`` in decimal: the byte offset of
    the record's start and its full framed size (data + 16 bytes of header and footer).
    This is exactly what NVIDIA DALI's ``tools/tfrecord2idx`` writes and what DALI's
    ``readers.TFRecord(index_path=...)`` reads, so DALI can use our indexes and we can
    use DALI's.

``<shard>.meta.npz`` (optional: a DALI-made index has none)
    ``np.savez`` columns, no pickled objects (:mod:`evenflow.records.sidecar_meta`): the
    label and cost columns, records left out as corrupt, and what the sidecars describe:
    the shard's size and record count, the digest of the ``.idx`` text, the stored data
    CRCs of sampled records and a digest of every record's
    (:mod:`evenflow.records.fingerprint`), and a checksum of all of that.

:func:`load_shard_index` checks both against the file: sizes, the records tiling the file,
the index's digest and the metadata's checksum; the stored CRCs are compared with the
file's where the file is read (:func:`evenflow.records.dataset_open.check_content`). Any
difference is one line naming the shard, what differs and the ``evenflow index`` command
that rebuilds the sidecars. The ``.idx`` text itself is read and written by
:mod:`evenflow.records.idx_text`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.fingerprint import Fingerprint, bytes_digest, fingerprint
from evenflow.records.tfrecord.frame import FRAME_BYTES
from evenflow.records.tfrecord.walk import open_mmap
from evenflow.records.idx_text import format_idx, parse_idx
from evenflow.records.sidecar_meta import META_VERSION, meta_text, read_meta, rebuild_command, recorded_content, seal


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
                   skipped_records=None, skipped_offsets=None, label_key: str | None = None,
                   cost_key: str | None = None, content: Fingerprint | None = None) -> None:
    """Write ``<shard>.idx`` and ``<shard>.meta.npz`` atomically.

    Args:
        shard: path of the TFRecord file, already in place: the stored CRCs of its records
            are read from it (unless ``content`` gives them).
        offsets: byte offset of each record, int ``[n]``.
        lengths: framed size of each record (data + 16), int ``[n]``.
        file_size: size of the shard in bytes.
        labels: optional int label per record ``[n]``.
        costs: optional float cost per record ``[n]``, >= 0.
        skipped_records, skipped_offsets: records left out as corrupt.
        label_key, cost_key: the features the labels and costs were read from, when known
            (named in the command that rebuilds stale sidecars).
        content: the :class:`~evenflow.records.fingerprint.Fingerprint` of the records, when
            the caller has it.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = offsets.shape[0]
    if content is None:
        content = fingerprint(np.frombuffer(open_mmap(os.fspath(shard)), dtype=np.uint8), offsets, lengths)
    text = format_idx(offsets, lengths)
    cols = {"format_version": np.int64(META_VERSION), "file_size": np.int64(file_size), "num_records": np.int64(n),
            "skipped_record": np.asarray(skipped_records if skipped_records is not None else [], dtype=np.int64),
            "skipped_offset": np.asarray(skipped_offsets if skipped_offsets is not None else [], dtype=np.int64),
            "idx_digest": np.array(bytes_digest(text)), "sample_record": content.sample_record.astype(np.int64),
            "sample_crc": content.sample_crc.astype(np.uint32), "crc_digest": np.array(content.crc_digest)}
    for name, values, dtype, key in (("label", labels, np.int64, label_key), ("cost", costs, np.float64, cost_key)):
        if values is None:
            continue
        arr = np.asarray(values)
        if arr.shape != (n,):
            raise ValueError(f"{shard}: {name} must have one entry per record, {n}, got shape {arr.shape}")
        cols[name] = arr.astype(dtype)
        if key:
            cols[f"{name}_key"] = np.array(str(key))
    cols = seal(cols)
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
        content: what the metadata recorded of the records' stored CRCs, to compare with the
            file's; None for an index without metadata (DALI's).
        rebuild: the ``evenflow index`` command (in backquotes) that rebuilds the sidecars.
        label_key, cost_key: the features the label and cost columns were read from, when
            the metadata names them.
    """

    path: str
    offsets: np.ndarray
    lengths: np.ndarray
    file_size: int
    labels: np.ndarray | None = None
    costs: np.ndarray | None = None
    skipped: int = 0
    numbers: np.ndarray | None = None
    content: Fingerprint | None = None
    rebuild: str = ""
    label_key: str | None = None
    cost_key: str | None = None

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


def load_shard_index(shard, keys=(None, None)) -> ShardIndex:
    """Load and check the sidecars of one shard against the shard file.

    Checks that lengths are at least 16, records do not overlap, and the index covers
    the file: the last offset + length equals the file size and records are contiguous,
    unless the metadata lists skipped corrupt records (then the recorded file size must
    match instead). With metadata, also that it is whole (its checksum), that it was
    written with this very ``.idx`` (its digest) for a file of this size and record count.
    The records' stored CRCs are compared with the metadata's where the file is read
    (:func:`evenflow.records.dataset_open.check_content`).

    Args:
        shard: the TFRecord file.
        keys: ``(label_key, cost_key)`` to name in the rebuild command (a manifest's), or None each.

    Raises:
        RecordError: missing index, unreadable index, or sidecars that do not match the
            file or each other; the message names the file, what differs and the command
            that rebuilds them.
    """
    found = _read_sidecars(os.fspath(shard), keys)
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
    content = None
    if found.meta:
        content = recorded_content(found.meta, found.text, found.offsets.shape[0], meta_path(found.shard))
        if isinstance(content, str):
            raise found.mismatch(content)
    labels = found.meta.get("label")
    costs = found.meta.get("cost")
    return ShardIndex(found.shard, found.offsets, found.lengths, found.file_size,
                      labels=None if labels is None else labels.astype(np.int64, copy=False),
                      costs=None if costs is None else costs.astype(np.float64, copy=False),
                      skipped=skipped,
                      numbers=kept_numbers(found.offsets.shape[0], found.meta.get("skipped_record", [])),
                      content=content, rebuild=found.rebuild, label_key=meta_text(found.meta.get("label_key")),
                      cost_key=meta_text(found.meta.get("cost_key")))


@dataclass
class _Sidecars:
    """The sidecars of one shard as read, and the size of the shard they describe."""

    shard: str
    ipath: str
    file_size: int
    text: bytes
    offsets: np.ndarray
    lengths: np.ndarray
    meta: dict
    rebuild: str

    def mismatch(self, what: str, record=None, offset=None, kind="index") -> RecordError:
        return RecordError(self.shard, f"index {self.ipath} does not match the file: {what}; rebuild it with "
                           f"{self.rebuild}", record=record, offset=offset, kind=kind)

    def cut_short(self, expected: int) -> RecordError:
        """The error for a file smaller than the ``expected`` bytes the index describes."""
        offsets, lengths, file_size, n = self.offsets, self.lengths, self.file_size, self.offsets.shape[0]
        over = np.flatnonzero(offsets + lengths > file_size)
        i = int(over[0]) if over.size else max(n - 1, 0)
        return self.mismatch(f"the file has {file_size} bytes but its index expects {expected}, so record {i} "
                             f"(ends at byte {int(offsets[i] + lengths[i]) if n else 0}) is cut short: the file "
                             f"was truncated", record=i, offset=int(offsets[i]) if n else 0, kind="truncated")


def _read_sidecars(shard: str, keys) -> _Sidecars:
    """Read ``<shard>.idx`` and, when present, ``<shard>.meta.npz``; nothing is checked against the file yet."""
    ipath = idx_path(shard)
    try:
        file_size = os.stat(shard).st_size
    except FileNotFoundError as e:
        raise RecordError(shard, "no such record file", kind="input") from e
    if os.path.isdir(shard):
        raise RecordError(shard, f"is a folder, not a TFRecord file; pass its TFRecord files, e.g. "
                          f"{os.path.join(shard, '*.tfrecord')}", kind="input")
    mpath = meta_path(shard)
    meta = read_meta(mpath, shard, keys) if os.path.exists(mpath) else {}
    rebuild = rebuild_command(shard, meta, keys)
    try:
        with open(ipath, "rb") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise RecordError(shard, f"missing index {ipath}; build it with {rebuild}", kind="index") from e
    except IsADirectoryError as e:
        raise RecordError(shard, f"index {ipath} is a folder, not an index file; move it away and build the "
                          f"index with {rebuild}", kind="index") from e
    except OSError as e:
        raise RecordError(shard, f"cannot read index {ipath} ({type(e).__name__}: {e.strerror})",
                          kind="index") from e
    offsets, lengths = parse_idx(text, ipath)
    return _Sidecars(shard, ipath, file_size, text, offsets, lengths, meta, rebuild)


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
