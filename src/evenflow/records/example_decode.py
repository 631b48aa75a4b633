"""Batch decoding of serialized ``tf.train.Example`` records into numpy arrays.

Records in one batch usually share one layout: the same keys in the same order, the
same list types, the same number of values. Three paths, fastest first:

1. *Template*: records of equal length that are byte-identical outside their numeric
   payloads (fixed-size features from one writer) all have record 0's layout; one
   comparison of the ``[B, L]`` byte matrix proves it.
2. *Lockstep*: walk the protobuf wire format of all records at once, one numpy
   operation per field for the whole batch instead of one Python call per field per
   record: tags compared across the batch, varint lengths read at a vector of cursors.

Either way the float payloads are then gathered with one fancy index and viewed as
float32, and int64 varints are decoded in bulk. Any deviation (another key order,
unpacked or repeated fields, unknown fields, a count that differs) sends the batch to

3. the *general* path, which parses each record with the protobuf ``Example`` class and
   gives exact proto semantics and precise errors.

They agree on every input they all accept (a property test checks it).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.example_proto import example_classes
from evenflow.records.spec import FeatureSpec, dtype_of_list

__all__ = ["ExampleError", "decode_example", "decode_examples", "infer_specs", "parse_one"]

_AR10 = np.arange(10)
_SHIFTS = (7 * np.arange(10)).astype(np.uint64)
_PAD = 10  # bytes of zero padding so a varint window never runs off the buffer
_TAGS = {"bytes": 0x0A, "float32": 0x12, "int64": 0x1A}  # Feature oneof tags


class ExampleError(RecordError):
    """A record that is not the Example its spec expects; ``record`` is its index in the batch."""

    def __init__(self, reason: str, *, record: int | None = None):
        super().__init__(None, reason, record=record, kind="feature")


class _Irregular(Exception):
    """The batch does not share one layout; use the general path."""


def _as_buffer(records) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(buffer + padding, starts, lengths)`` from a list of bytes or such a triple."""
    if isinstance(records, tuple) and len(records) == 3 and isinstance(records[0], np.ndarray):
        buf, starts, lengths = records
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        padded = np.concatenate([np.asarray(buf, dtype=np.uint8).reshape(-1), np.zeros(_PAD, np.uint8)])
        return padded, starts, lengths
    items = [bytes(r) for r in records]
    lengths = np.fromiter((len(r) for r in items), dtype=np.int64, count=len(items))
    starts = np.cumsum(lengths) - lengths
    padded = np.frombuffer(b"".join(items) + bytes(_PAD), dtype=np.uint8)
    return padded, starts, lengths


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
        raise _Irregular
    n = np.argmin(cont, axis=1) + 1
    parts = (w & 0x7F).astype(np.uint64) << _SHIFTS
    parts[_AR10 >= n[:, None]] = 0
    return parts.sum(axis=1, dtype=np.uint64), n


def _expect(buf, c, tag: int):
    if not (buf[c] == tag).all():
        raise _Irregular


def _length(buf, c):
    """Read a length-delimited header at ``c`` (after the tag); returns ``(start, length)``."""
    v, n = _varint_at(buf, c)
    return c + n, v.astype(np.int64)


def _same(x: np.ndarray) -> int:
    if not (x == x[0]).all():
        raise _Irregular
    return int(x[0])


def _gather(buf, starts, lengths) -> np.ndarray:
    """Concatenate ``buf[starts[i]:starts[i]+lengths[i]]`` for all i in one fancy index."""
    total = int(lengths.sum())
    out_starts = np.cumsum(lengths) - lengths
    src = np.arange(total, dtype=np.int64) + np.repeat(starts - out_starts, lengths)
    return buf[src]


def _decode_varints(data: np.ndarray, total_values: int) -> np.ndarray:
    """Decode ``total_values`` concatenated varints."""
    if data.size == 0:
        return np.zeros(0, np.int64)
    last = data < 0x80
    if int(last.sum()) != total_values or not last[-1]:
        raise _Irregular
    first = np.empty_like(last)
    first[0] = True
    first[1:] = last[:-1]
    group_starts = np.flatnonzero(first)
    pos = np.arange(data.size) - np.repeat(group_starts, np.diff(np.append(group_starts, data.size)))
    if pos.max() > 9:
        raise _Irregular
    parts = (data & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, group_starts).view(np.int64)


def _layout(buf, starts, lengths, specs: Mapping[str, FeatureSpec]) -> dict[str, object]:
    """Walk all records in lockstep; returns where each requested feature's values are.

    For float/int64 features: ``(payload starts [B], payload lengths [B])`` of the packed
    values; for bytes features: a list of such pairs, one per item.
    """
    b = starts.shape[0]
    end = starts + lengths
    _expect(buf, starts, 0x0A)  # Example.features
    c, flen = _length(buf, starts + 1)
    if not (c + flen == end).all():
        raise _Irregular
    spans: dict[str, tuple] = {}
    while True:
        done = c == end
        if done.all():
            break
        if done.any():
            raise _Irregular
        _expect(buf, c, 0x0A)  # Features.feature map entry
        c, elen = _length(buf, c + 1)
        entry_end = c + elen
        if (entry_end > end).any():
            raise _Irregular
        _expect(buf, c, 0x0A)  # entry key
        c, klen = _length(buf, c + 1)
        k = _same(klen)
        if (c + k > entry_end).any():
            raise _Irregular
        key_bytes = buf[c[:, None] + np.arange(k)]
        if not (key_bytes == key_bytes[0]).all():
            raise _Irregular
        key = key_bytes[0].tobytes().decode("utf-8", "replace")
        c = c + k
        if key in spans:
            raise _Irregular  # duplicate key: the last one wins in proto; let the general path do it
        spec = specs.get(key)
        if spec is None:
            spans[key] = None
            c = entry_end
            continue
        _expect(buf, c, 0x12)  # entry value: Feature
        c, vlen = _length(buf, c + 1)
        if not (c + vlen == entry_end).all():
            raise _Irregular
        tag = _same(buf[c])
        if tag != {"bytes": 0x0A, "float32": 0x12, "int64": 0x1A}[spec.dtype]:
            raise _Irregular
        c, llen = _length(buf, c + 1)
        list_end = c + llen
        if not (list_end == entry_end).all():
            raise _Irregular
        if spec.dtype == "bytes":
            items = []
            for _ in range(spec.size):
                _expect(buf, c, 0x0A)
                c, blen = _length(buf, c + 1)
                if (c + blen > list_end).any():
                    raise _Irregular
                items.append((c, blen))
                c = c + blen
            if not (c == list_end).all():
                raise _Irregular
            spans[key] = items
        elif spec.size == 0:
            if not (llen == 0).all():
                raise _Irregular
            spans[key] = (c, np.zeros(b, np.int64))
        else:
            _expect(buf, c, 0x0A)  # packed values
            c, plen = _length(buf, c + 1)
            if not (c + plen == list_end).all():
                raise _Irregular
            spans[key] = (c, plen)
        c = entry_end
    if any(spans.get(key) is None for key in specs):
        raise _Irregular  # missing somewhere: the general path names the record
    return {key: spans[key] for key in specs}


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Irregular
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _layout_one(rec: bytes, specs: Mapping[str, FeatureSpec]) -> dict[str, tuple[int, int]]:
    """``key -> (payload offset, payload length)`` of one record's packed numeric features.

    The single-record twin of :func:`_layout` in plain Python (cheaper than numpy calls
    on one-element arrays), with the same notion of a regular record.
    """
    if not rec or rec[0] != 0x0A:
        raise _Irregular
    flen, pos = _read_varint(rec, 1)
    if pos + flen != len(rec):
        raise _Irregular
    found: dict[str, tuple[int, int] | None] = {}
    while pos < len(rec):
        if rec[pos] != 0x0A:
            raise _Irregular
        elen, pos = _read_varint(rec, pos + 1)
        entry_end = pos + elen
        if entry_end > len(rec) or rec[pos] != 0x0A:
            raise _Irregular
        klen, pos = _read_varint(rec, pos + 1)
        key = rec[pos:pos + klen].decode("utf-8", "replace")
        pos += klen
        if key in found:
            raise _Irregular
        spec = specs.get(key)
        if spec is None:
            found[key] = None
            pos = entry_end
            continue
        if pos >= entry_end or rec[pos] != 0x12:
            raise _Irregular
        vlen, pos = _read_varint(rec, pos + 1)
        if pos + vlen != entry_end or pos >= entry_end or rec[pos] != _TAGS[spec.dtype]:
            raise _Irregular
        llen, pos = _read_varint(rec, pos + 1)
        if pos + llen != entry_end:
            raise _Irregular
        if spec.size == 0:
            if llen:
                raise _Irregular
            found[key] = (pos, 0)
        else:
            if rec[pos] != 0x0A:
                raise _Irregular
            plen, pos = _read_varint(rec, pos + 1)
            if pos + plen != entry_end:
                raise _Irregular
            found[key] = (pos, plen)
        pos = entry_end
    if any(found.get(k) is None for k in specs):
        raise _Irregular
    return {k: found[k] for k in specs}


def _template(buf, starts, lengths, specs: Mapping[str, FeatureSpec]) -> dict[str, object]:
    """Layout of a batch whose records are byte-identical outside the numeric values.

    Records of fixed-size features written by one writer usually are: same length, same
    keys, same framing; only the packed float/int64 payloads differ. Then the layout of
    record 0 holds for all, which one comparison of the ``[B, L]`` byte matrix proves.
    """
    size = int(lengths[0])
    if starts.shape[0] < 2 or not (lengths == size).all() or any(s.dtype == "bytes" for s in specs.values()):
        raise _Irregular
    s0 = int(starts[0])
    rel = _layout_one(buf[s0:s0 + size].tobytes(), specs)
    same = np.ones(size, dtype=bool)  # bytes that must be equal in every record
    for lo, n in rel.values():
        same[lo:lo + n] = False
    mat = buf[starts[:, None] + np.flatnonzero(same)]
    if not (mat == mat[0]).all():
        raise _Irregular
    b = starts.shape[0]
    return {key: (starts + lo, np.full(b, n, dtype=np.int64)) for key, (lo, n) in rel.items()}


def _extract(buf, spans: dict, specs: Mapping[str, FeatureSpec], b: int) -> dict[str, np.ndarray]:
    """Gather every feature's values for the whole batch from the located spans."""
    out = {}
    for key, spec in specs.items():
        span = spans[key]
        if spec.dtype == "float32":
            pstart, plen = span
            if not (plen == 4 * spec.size).all():
                raise _Irregular
            raw = buf[pstart[:, None] + np.arange(4 * spec.size)] if spec.size else np.zeros((b, 0), np.uint8)
            out[key] = raw.view("<f4").astype(np.float32, copy=False).reshape((b,) + spec.shape)
        elif spec.dtype == "int64":
            pstart, plen = span
            if spec.size == 0:
                out[key] = np.zeros((b,) + spec.shape, np.int64)
                continue
            if (plen == spec.size).all():  # every value is one byte: the common small-label case
                vals = buf[pstart[:, None] + np.arange(spec.size)]
                if (vals >= 0x80).any():
                    raise _Irregular
                out[key] = vals.astype(np.int64).reshape((b,) + spec.shape)
                continue
            data = _gather(buf, pstart, plen)
            # Each record's payload must end on a varint boundary and hold spec.size values.
            ends = np.cumsum(plen) - 1
            if (data[ends] >= 0x80).any():
                raise _Irregular
            counts = np.add.reduceat((data < 0x80).astype(np.int64), np.cumsum(plen) - plen)
            if not (counts == spec.size).all():
                raise _Irregular
            vals = _decode_varints(data, b * spec.size)
            out[key] = vals.reshape((b,) + spec.shape)
        else:
            raw = buf.tobytes()
            arr = np.empty((b, spec.size), dtype=object)
            for j, (s, n) in enumerate(span):
                arr[:, j] = [raw[x:x + m] for x, m in zip(s.tolist(), n.tolist())]
            out[key] = arr.reshape((b,) + spec.shape)
    return out


def parse_one(record: bytes, i: int):
    """Parse one record with the protobuf ``Example`` class; ``i`` is its index for errors."""
    from google.protobuf.message import DecodeError
    try:
        return example_classes()["Example"].FromString(record)
    except DecodeError as e:
        raise ExampleError(f"not a tf.train.Example: {e}", record=i) from e


def _general(buf, starts, lengths, specs: Mapping[str, FeatureSpec]) -> dict[str, np.ndarray]:
    from google.protobuf.message import DecodeError
    from_string = example_classes()["Example"].FromString
    b = starts.shape[0]
    out = {key: np.empty((b, spec.size), dtype=object if spec.dtype == "bytes" else spec.dtype)
           for key, spec in specs.items()}
    plan = [(key, spec.list_name, spec.size, out[key]) for key, spec in specs.items()]
    raw = buf.tobytes()
    for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        try:
            fmap = from_string(raw[s:s + n]).features.feature
        except DecodeError as e:
            raise ExampleError(f"not a tf.train.Example: {e}", record=i) from e
        for key, list_name, size, dest in plan:
            if key not in fmap:
                have = ", ".join(sorted(fmap)) or "none"
                raise ExampleError(f"feature {key!r} is not in the record (its features: {have}); pick one of "
                                   f"those with --feature-key / features=", record=i)
            feature = fmap[key]
            kind = feature.WhichOneof("kind")
            if kind != list_name:
                raise ExampleError(f"feature {key!r} is a {kind or 'empty Feature'}, the spec expects "
                                   f"{list_name} ({specs[key].dtype})", record=i)
            values = getattr(feature, kind).value
            if len(values) != size:
                raise ExampleError(f"feature {key!r} has {len(values)} values, the spec expects shape "
                                   f"{specs[key].shape} = {size} values", record=i)
            if size:
                dest[i] = list(values)  # a plain list converts much faster than the container
    return {key: out[key].reshape((b,) + spec.shape) for key, spec in specs.items()}


def decode_examples(records, specs: Mapping[str, FeatureSpec], *, fast: bool = True) -> dict[str, np.ndarray]:
    """Decode a batch of serialized Examples into one array per feature.

    Args:
        records: a sequence of ``bytes``, or a triple ``(buffer uint8, starts, lengths)``
            as returned by :meth:`RecordDataset.read_batch_buffer`.
        specs: key -> :class:`FeatureSpec` of each feature to decode; other keys in the
            records are ignored.
        fast: try the vectorised lockstep path first (the result is the same either way).

    Returns:
        key -> array ``[batch, *spec.shape]``: float32, int64, or object holding ``bytes``.

    Raises:
        ExampleError: a record lacks a key, has another list type, another number of
            values, or is not an Example; ``record`` is its index in the batch.
    """
    if not isinstance(specs, Mapping) or not all(isinstance(s, FeatureSpec) for s in specs.values()):
        raise TypeError("specs must map feature keys to FeatureSpec, e.g. {'x': FeatureSpec('float32', (64,))}")
    buf, starts, lengths = _as_buffer(records)
    if starts.shape[0] == 0:
        return {key: np.empty((0,) + spec.shape, dtype=object if spec.dtype == "bytes" else spec.dtype)
                for key, spec in specs.items()}
    if fast:
        try:
            return _fast(buf, starts, lengths, specs)
        except (_Irregular, IndexError):
            pass
    return _general(buf, starts, lengths, specs)


def _fast(buf, starts, lengths, specs) -> dict[str, np.ndarray]:
    try:
        spans = _template(buf, starts, lengths, specs)
    except (_Irregular, IndexError):
        spans = _layout(buf, starts, lengths, specs)
    return _extract(buf, spans, specs, starts.shape[0])


def decode_example(record: bytes, specs: Mapping[str, FeatureSpec]) -> dict[str, np.ndarray]:
    """Decode one Example; arrays have the spec's shape (no batch axis)."""
    return {k: v[0] for k, v in decode_examples([record], specs).items()}


def infer_specs(record: bytes) -> dict[str, FeatureSpec]:
    """Guess specs from one serialized Example: list type and length (1 value -> shape ``()``)."""
    msg = parse_one(record, 0)
    specs = {}
    for key in sorted(msg.features.feature):
        feature = msg.features.feature[key]
        kind = feature.WhichOneof("kind")
        if kind is None:
            continue
        n = len(getattr(feature, kind).value)
        specs[key] = FeatureSpec(dtype_of_list(kind), () if n == 1 else (n,))
    return specs
