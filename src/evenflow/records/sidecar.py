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

The text index is parsed by numpy's C parser after a vectorised check that it holds
only digits, spaces and newlines, two numbers a line; a million lines load in about a
tenth of a second, so no binary copy is kept (it could go stale against the text).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.frame import FRAME_BYTES

__all__ = ["ShardIndex", "idx_path", "load_shard_index", "meta_path", "parse_idx", "write_sidecars"]

META_VERSION = 1


def idx_path(shard) -> str:
    return os.fspath(shard) + ".idx"


def meta_path(shard) -> str:
    return os.fspath(shard) + ".meta.npz"


def format_idx(offsets: np.ndarray, lengths: np.ndarray) -> bytes:
    """DALI ``tfrecord2idx`` text for the given records."""
    n = len(offsets)
    if n == 0:
        return b""
    pairs = np.empty(2 * n, dtype=np.int64)
    pairs[0::2] = offsets
    pairs[1::2] = lengths
    # One %-format over all lines is about twice as fast as joining per-line strings.
    return (("%d %d\n" * n) % tuple(pairs.tolist())).encode("ascii")


def parse_idx(data: bytes, path="<idx>") -> tuple[np.ndarray, np.ndarray]:
    """Parse DALI index text into ``(offsets, lengths)``, both int64 ``[n]``.

    Accepts what ``tfrecord2idx`` writes: two non-negative decimal integers a line,
    separated by spaces or tabs, ``\\n`` or ``\\r\\n`` line ends, blank lines ignored.

    Raises:
        RecordError: naming ``path`` and the first bad line.
    """
    a = np.frombuffer(data, dtype=np.uint8)
    if a.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cls = _CHAR_CLASS[a]  # 0 bad, 1 digit, 2 blank, 3 newline: one pass over the text
    if not cls.all():
        pos = int(np.flatnonzero(cls == 0)[0])
        line = int(np.count_nonzero(a[:pos] == 10)) + 1
        raise RecordError(path, f"line {line}: unexpected character {bytes(a[pos:pos + 1])!r}; an index line is "
                          f"'<offset> <length>'; rebuild it with `evenflow index <shard>`", kind="index")
    digit = cls == 1
    starts = np.flatnonzero(digit[1:] & ~digit[:-1]) + 1
    if digit[0]:
        starts = np.concatenate([[0], starts])
    ends = np.flatnonzero(digit[:-1] & ~digit[1:])
    if digit[-1]:
        ends = np.append(ends, a.size - 1)
    # Numbers per line (every non-blank line must hold two), from where the newlines fall.
    newlines = np.flatnonzero(cls == 3)
    before = np.searchsorted(starts, np.append(newlines, a.size))
    per_line = np.diff(before, prepend=0)
    wrong = np.flatnonzero((per_line != 0) & (per_line != 2))
    if wrong.size:
        line = int(wrong[0]) + 1
        raise RecordError(path, f"line {line}: expected 2 numbers '<offset> <length>', found {per_line[wrong[0]]}; "
                          f"rebuild it with `evenflow index <shard>`", kind="index")
    if np.any(ends - starts >= 18):
        raise RecordError(path, "a number has more than 18 digits; that is not a byte offset", kind="index")
    values = np.fromstring(data.decode("ascii"), dtype=np.int64, sep=" ")  # C speed; checked above
    if values.size != starts.size:  # pragma: no cover - guarded by the checks above
        raise RecordError(path, "could not parse the index; rebuild it with `evenflow index <shard>`", kind="index")
    return values[0::2].copy(), values[1::2].copy()


_CHAR_CLASS = np.zeros(256, dtype=np.uint8)
_CHAR_CLASS[ord("0"):ord("9") + 1] = 1
_CHAR_CLASS[[ord(" "), ord("\t"), ord("\r")]] = 2
_CHAR_CLASS[ord("\n")] = 3


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
    """

    path: str
    offsets: np.ndarray
    lengths: np.ndarray
    file_size: int
    labels: np.ndarray | None = None
    costs: np.ndarray | None = None
    skipped: int = 0

    @property
    def num_records(self) -> int:
        return int(self.offsets.shape[0])


def _load_meta(path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise RecordError(path, f"cannot read the index metadata ({e}); delete it and rebuild with "
                          f"`evenflow index <shard>`", kind="index") from e


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
    shard = os.fspath(shard)
    ipath = idx_path(shard)
    try:
        file_size = os.stat(shard).st_size
    except FileNotFoundError as e:
        raise RecordError(shard, "no such record file", kind="input") from e
    try:
        with open(ipath, "rb") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise RecordError(shard, f"missing index {ipath}; build it with `evenflow index {shard}`",
                          kind="index") from e
    offsets, lengths = parse_idx(text, ipath)
    n = offsets.shape[0]
    meta = _load_meta(meta_path(shard)) if os.path.exists(meta_path(shard)) else {}

    def mismatch(what: str, record=None, offset=None, kind="index"):
        return RecordError(shard, f"index {ipath} does not match the file: {what}; rebuild it with "
                           f"`evenflow index {shard}`", record=record, offset=offset, kind=kind)

    def shorter(expected: int):
        over = np.flatnonzero(offsets + lengths > file_size)
        i = int(over[0]) if over.size else max(n - 1, 0)
        return mismatch(f"the file has {file_size} bytes but its index expects {expected}, so record {i} "
                        f"(ends at byte {int(offsets[i] + lengths[i]) if n else 0}) is cut short: the file was "
                        f"truncated", record=i, offset=int(offsets[i]) if n else 0, kind="truncated")

    if meta:
        if int(meta["num_records"]) != n:
            raise mismatch(f"{meta_path(shard)} says {int(meta['num_records'])} records, the index has {n}")
        built_for = int(meta["file_size"])
        if built_for > file_size:
            raise shorter(built_for)
        if built_for != file_size:
            raise mismatch(f"the index was built for a file of {built_for} bytes, the file has {file_size} "
                           f"bytes; it was appended to or rewritten", offset=built_for)
    skipped = int(meta["skipped_record"].shape[0]) if "skipped_record" in meta else 0
    if n:
        short = np.flatnonzero(lengths < FRAME_BYTES)
        if short.size:
            i = int(short[0])
            raise mismatch(f"line {i + 1} gives length {lengths[i]}, less than the 16 bytes of framing",
                           record=i, offset=offsets[i])
        ends = offsets + lengths
        if ends[-1] > file_size:
            raise shorter(int(ends[-1]))
        if skipped == 0:
            if offsets[0] != 0:
                raise mismatch(f"first record starts at byte {offsets[0]}, not 0", record=0, offset=offsets[0])
            gaps = np.flatnonzero(offsets[1:] != ends[:-1])
            if gaps.size:
                i = int(gaps[0]) + 1
                raise mismatch(f"record {i} starts at byte {offsets[i]} but record {i - 1} ends at byte "
                               f"{ends[i - 1]}", record=i, offset=offsets[i])
            if ends[-1] != file_size:
                raise mismatch(f"index ends at byte {ends[-1]} (offset {offsets[-1]} + length {lengths[-1]}) "
                               f"but the file has {file_size} bytes")
        else:
            overlap = np.flatnonzero(offsets[1:] < ends[:-1])
            if overlap.size:
                i = int(overlap[0]) + 1
                raise mismatch(f"record {i} at byte {offsets[i]} overlaps record {i - 1}", record=i,
                               offset=offsets[i])
    elif skipped == 0 and file_size != 0:
        raise mismatch(f"the index lists no records but the file has {file_size} bytes")
    labels = meta.get("label")
    costs = meta.get("cost")
    return ShardIndex(shard, offsets, lengths, file_size,
                      labels=None if labels is None else labels.astype(np.int64, copy=False),
                      costs=None if costs is None else costs.astype(np.float64, copy=False),
                      skipped=skipped)


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

