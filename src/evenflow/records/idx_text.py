"""The ``.idx`` text of a TFRecord shard: one ``"<offset> <length>\\n"`` line per record.

This is exactly what NVIDIA DALI's ``tools/tfrecord2idx`` writes and what DALI's
``readers.TFRecord(index_path=...)`` reads: the byte offset of each record's start and
its full framed size (data + 16 bytes of header and footer), in decimal.

The text is parsed by numpy's C parser after a vectorised check that it holds only
digits, spaces and newlines, two numbers a line; a million lines load in about a tenth
of a second, so no binary copy is kept (it could go stale against the text).
"""
from __future__ import annotations

import numpy as np

from evenflow.records.errors import RecordError


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
        RecordError: naming ``path`` and the first bad line, and the ``evenflow index`` command
            that rebuilds it (for the shard ``path`` is the ``.idx`` of).
    """
    path = str(path)
    fix = f"rebuild it with `evenflow index {path[:-len('.idx')] if path.endswith('.idx') else '<shard>'}`"
    a = np.frombuffer(data, dtype=np.uint8)
    if a.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cls = _CHAR_CLASS[a]  # 0 bad, 1 digit, 2 blank, 3 newline: one pass over the text
    if not cls.all():
        pos = int(np.flatnonzero(cls == 0)[0])
        line = int(np.count_nonzero(a[:pos] == 10)) + 1
        raise RecordError(path, f"line {line}: unexpected character {bytes(a[pos:pos + 1])!r}; an index line is "
                          f"'<offset> <length>'; {fix}", kind="index")
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
                          f"{fix}", kind="index")
    if np.any(ends - starts >= 18):
        raise RecordError(path, f"a number has more than 18 digits; that is not a byte offset; {fix}", kind="index")
    values = np.fromstring(data.decode("ascii"), dtype=np.int64, sep=" ")  # C speed; checked above
    if values.size != starts.size:  # pragma: no cover - guarded by the checks above
        raise RecordError(path, f"could not parse the index; {fix}", kind="index")
    return values[0::2].copy(), values[1::2].copy()


_CHAR_CLASS = np.zeros(256, dtype=np.uint8)
_CHAR_CLASS[ord("0"):ord("9") + 1] = 1
_CHAR_CLASS[[ord(" "), ord("\t"), ord("\r")]] = 2
_CHAR_CLASS[ord("\n")] = 3
