"""Where each feature's values lie in a batch of serialized ``tf.train.Example`` records.

The fast paths of :mod:`evenflow.records.example.decode` find the values without parsing
each record with protobuf:

* :func:`template_layout`: records of equal length that are byte-identical outside their
  numeric payloads (fixed-size features from one writer) all have record 0's layout; one
  comparison of the ``[B, L]`` byte matrix proves it.
* :func:`lockstep_layout`: walk the protobuf wire format of all records at once, one numpy
  operation per field for the whole batch instead of one Python call per field per
  record: tags compared across the batch, varint lengths read at a vector of cursors.

Both raise :class:`Irregular` when the batch does not share one layout (another key
order, unpacked or repeated fields, unknown fields, a count that differs).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from evenflow.records.example.spec import FeatureSpec

_AR10 = np.arange(10)
_SHIFTS = (7 * np.arange(10)).astype(np.uint64)
_TAGS = {"bytes": 0x0A, "float32": 0x12, "int64": 0x1A}  # Feature oneof tags


class Irregular(Exception):
    """The batch does not share one layout; use the general path."""


def _varint_at(buf: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Read one varint at each cursor; returns ``(values uint64, bytes used)``."""
    first = buf[c]
    one = first < 0x80
    if one.all():
        return first.astype(np.uint64), np.ones(c.shape, np.int64)
    second = buf[c + 1]
    if (one | (second < 0x80)).all():  # lengths below 16384: at most two bytes
        v = first.astype(np.uint64)
        v[~one] = (v[~one] & np.uint64(0x7F)) | (second[~one].astype(np.uint64) << np.uint64(7))
        return v, 2 - one.astype(np.int64)
    w = buf[c[:, None] + _AR10]
    cont = w >= 0x80
    if cont.all(axis=1).any():
        raise Irregular
    n = np.argmin(cont, axis=1) + 1
    parts = (w & 0x7F).astype(np.uint64) << _SHIFTS
    parts[_AR10 >= n[:, None]] = 0
    return parts.sum(axis=1, dtype=np.uint64), n


def _expect(buf, c, tag: int):
    if not (buf[c] == tag).all():
        raise Irregular


def _length(buf, c):
    """Read a length-delimited header at ``c`` (after the tag); returns ``(start, length)``."""
    v, n = _varint_at(buf, c)
    return c + n, v.astype(np.int64)


def _same(x: np.ndarray) -> int:
    if not (x == x[0]).all():
        raise Irregular
    return int(x[0])


def lockstep_layout(buf, starts, lengths, specs: Mapping[str, FeatureSpec]) -> dict[str, object]:
    """Walk all records in lockstep; returns where each requested feature's values are.

    For float/int64 features: ``(payload starts [B], payload lengths [B])`` of the packed
    values (length 0 for an empty list); for bytes features: a list of such pairs, one per item.
    """
    b = starts.shape[0]
    end = starts + lengths
    _expect(buf, starts, 0x0A)  # Example.features
    c, flen = _length(buf, starts + 1)
    if not (c + flen == end).all():
        raise Irregular
    spans: dict[str, tuple] = {}
    while True:
        done = c == end
        if done.all():
            break
        if done.any():
            raise Irregular
        key, c, entry_end = _entry_key(buf, c, end)
        if key in spans:
            raise Irregular  # duplicate key: the last one wins in proto; let the general path do it
        spec = specs.get(key)
        spans[key] = None if spec is None else _feature_span(buf, c, entry_end, spec, b)
        c = entry_end
    if any(spans.get(key) is None for key in specs):
        raise Irregular  # missing somewhere: the general path names the record
    return {key: spans[key] for key in specs}


def _entry_key(buf, c, end) -> tuple[str, np.ndarray, np.ndarray]:
    """Read the key of the ``Features.feature`` map entry at ``c``, the same in every record.

    Returns:
        ``(key, cursors after the key, entry ends)``.
    """
    _expect(buf, c, 0x0A)  # Features.feature map entry
    c, elen = _length(buf, c + 1)
    entry_end = c + elen
    if (entry_end > end).any():
        raise Irregular
    _expect(buf, c, 0x0A)  # entry key
    c, klen = _length(buf, c + 1)
    k = _same(klen)
    if (c + k > entry_end).any():
        raise Irregular
    key_bytes = buf[c[:, None] + np.arange(k)]
    if not (key_bytes == key_bytes[0]).all():
        raise Irregular
    return key_bytes[0].tobytes().decode("utf-8", "replace"), c + k, entry_end


def _feature_span(buf, c, entry_end, spec: FeatureSpec, b: int):
    """Where the values of the ``Feature`` at ``c`` (an entry's value) are, in every record."""
    _expect(buf, c, 0x12)  # entry value: Feature
    c, vlen = _length(buf, c + 1)
    if not (c + vlen == entry_end).all():
        raise Irregular
    if _same(buf[c]) != _TAGS[spec.dtype]:
        raise Irregular
    c, llen = _length(buf, c + 1)
    list_end = c + llen
    if not (list_end == entry_end).all():
        raise Irregular
    if spec.dtype == "bytes":
        return _bytes_spans(buf, c, list_end, spec.size)
    if spec.size == 0 or (spec.varlen and (llen == 0).all()):
        if not (llen == 0).all():
            raise Irregular
        return c, np.zeros(b, np.int64)
    if spec.varlen and (llen == 0).any():  # empty lists have no packed field: read the others'
        full = llen > 0
        starts, plen = c.copy(), np.zeros(b, np.int64)
        starts[full], plen[full] = _packed(buf, c[full], list_end[full])
        return starts, plen
    return _packed(buf, c, list_end)


def _packed(buf, c, list_end):
    """``(payload starts, payload lengths)`` of the packed values field at ``c``, filling each list."""
    _expect(buf, c, 0x0A)
    c, plen = _length(buf, c + 1)
    if not (c + plen == list_end).all():
        raise Irregular
    return c, plen


def _bytes_spans(buf, c, list_end, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(starts [B], lengths [B])`` of each of the ``size`` items of a ``BytesList``."""
    items = []
    for _ in range(size):
        _expect(buf, c, 0x0A)
        c, blen = _length(buf, c + 1)
        if (c + blen > list_end).any():
            raise Irregular
        items.append((c, blen))
        c = c + blen
    if not (c == list_end).all():
        raise Irregular
    return items


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise Irregular
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _layout_one(rec: bytes, specs: Mapping[str, FeatureSpec]) -> dict[str, tuple[int, int]]:
    """``key -> (payload offset, payload length)`` of one record's packed numeric features.

    The single-record twin of :func:`lockstep_layout` in plain Python (cheaper than numpy
    calls on one-element arrays), with the same notion of a regular record.
    """
    if not rec or rec[0] != 0x0A:
        raise Irregular
    flen, pos = _read_varint(rec, 1)
    if pos + flen != len(rec):
        raise Irregular
    found: dict[str, tuple[int, int] | None] = {}
    while pos < len(rec):
        if rec[pos] != 0x0A:
            raise Irregular
        elen, pos = _read_varint(rec, pos + 1)
        entry_end = pos + elen
        if entry_end > len(rec) or rec[pos] != 0x0A:
            raise Irregular
        klen, pos = _read_varint(rec, pos + 1)
        key = rec[pos:pos + klen].decode("utf-8", "replace")
        pos += klen
        if key in found:
            raise Irregular
        spec = specs.get(key)
        if spec is None:
            found[key] = None
            pos = entry_end
            continue
        if pos >= entry_end or rec[pos] != 0x12:
            raise Irregular
        vlen, pos = _read_varint(rec, pos + 1)
        if pos + vlen != entry_end or pos >= entry_end or rec[pos] != _TAGS[spec.dtype]:
            raise Irregular
        llen, pos = _read_varint(rec, pos + 1)
        if pos + llen != entry_end:
            raise Irregular
        if spec.size == 0 or (spec.varlen and llen == 0):
            if llen:
                raise Irregular
            found[key] = (pos, 0)
        else:
            if rec[pos] != 0x0A:
                raise Irregular
            plen, pos = _read_varint(rec, pos + 1)
            if pos + plen != entry_end:
                raise Irregular
            found[key] = (pos, plen)
        pos = entry_end
    if any(found.get(k) is None for k in specs):
        raise Irregular
    return {k: found[k] for k in specs}


def template_layout(buf, starts, lengths, specs: Mapping[str, FeatureSpec]) -> dict[str, object]:
    """Layout of a batch whose records are byte-identical outside the numeric values.

    Records of fixed-size features written by one writer usually are: same length, same
    keys, same framing; only the packed float/int64 payloads differ. Then the layout of
    record 0 holds for all, which one comparison of the ``[B, L]`` byte matrix proves.
    """
    size = int(lengths[0])
    if starts.shape[0] < 2 or not (lengths == size).all() or any(s.dtype == "bytes" for s in specs.values()):
        raise Irregular
    s0 = int(starts[0])
    rel = _layout_one(buf[s0:s0 + size].tobytes(), specs)
    same = np.ones(size, dtype=bool)  # bytes that must be equal in every record
    for lo, n in rel.values():
        same[lo:lo + n] = False
    mat = buf[starts[:, None] + np.flatnonzero(same)]
    if not (mat == mat[0]).all():
        raise Irregular
    b = starts.shape[0]
    return {key: (starts + lo, np.full(b, n, dtype=np.int64)) for key, (lo, n) in rel.items()}
