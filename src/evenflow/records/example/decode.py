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

They agree on every input they all accept (a property test checks it). The fast paths
find the values with :mod:`evenflow.records.example.layout` and gather them with
:mod:`evenflow.records.example.extract`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.example.extract import extract
from evenflow.records.example.layout import Irregular, lockstep_layout, template_layout
from evenflow.records.example.proto import example_classes
from evenflow.records.example.spec import FeatureSpec, dtype_of_list

_PAD = 10  # bytes of zero padding so a varint window never runs off the buffer
# Records decoded at a time: the fast paths' temporaries (several per byte of the batch) then stay
# small; a whole dataset decoded in one piece (a cache being filled) ran several times slower.
_CHUNK = 4096


class ExampleError(RecordError):
    """A record that is not the Example its spec expects; ``record`` is its index in the batch."""

    def __init__(self, reason: str, *, record: int | None = None):
        super().__init__(None, reason, record=record, kind="feature")


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
    out = {key: _empty(b, spec) for key, spec in specs.items()}
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
            if size is None and kind is None:  # an empty Feature: an empty list, as tf.io.parse_example reads it
                dest[i] = np.zeros(0, specs[key].dtype)
                continue
            if kind != list_name:
                raise ExampleError(f"feature {key!r} is a {kind or 'empty Feature'}, the spec expects "
                                   f"{list_name} ({specs[key].dtype}{', variable length' if size is None else ''})",
                                   record=i)
            values = getattr(feature, kind).value
            if size is None:
                dest[i] = np.array(values, dtype=specs[key].dtype)
            elif len(values) != size:
                raise ExampleError(f"feature {key!r} has {len(values)} values, the spec expects shape "
                                   f"{specs[key].shape} = {size} values", record=i)
            elif size:
                dest[i] = list(values)  # a plain list converts much faster than the container
    return {key: out[key] if spec.varlen else out[key].reshape((b,) + spec.shape) for key, spec in specs.items()}


def _empty(b: int, spec: FeatureSpec) -> np.ndarray:
    """The array :func:`decode_examples` fills for ``b`` records: ``[b, size]``, or object ``[b]`` of
    one array per record for a variable-length list."""
    if spec.varlen:
        return np.empty(b, dtype=object)
    return np.empty((b, spec.size), dtype=object if spec.dtype == "bytes" else spec.dtype)


def decode_examples(records, specs: Mapping[str, FeatureSpec], *, fast: bool = True) -> dict[str, np.ndarray]:
    """Decode a batch of serialized Examples into one array per feature.

    Args:
        records: a sequence of ``bytes``, or a triple ``(buffer uint8, starts, lengths)``
            as returned by :meth:`RecordDataset.read_batch_buffer`.
        specs: key -> :class:`FeatureSpec` of each feature to decode; other keys in the
            records are ignored.
        fast: try the vectorised lockstep path first (the result is the same either way).

    Returns:
        key -> array ``[batch, *spec.shape]``: float32, int64, or object holding ``bytes``;
        for a variable-length list (shape ``(None,)``), object ``[batch]`` holding one float32
        or int64 array per record (of any length, 0 included).

    Raises:
        ExampleError: a record lacks a key, has another list type, another number of
            values, or is not an Example; ``record`` is its index in the batch.
    """
    if not isinstance(specs, Mapping) or not all(isinstance(s, FeatureSpec) for s in specs.values()):
        raise TypeError("specs must map feature keys to FeatureSpec, e.g. {'x': FeatureSpec('float32', (64,))}")
    buf, starts, lengths = _as_buffer(records)
    if starts.shape[0] == 0:
        return {key: _empty(0, spec) if spec.varlen else _empty(0, spec).reshape((0,) + spec.shape)
                for key, spec in specs.items()}
    parts = []
    for lo in range(0, starts.shape[0], _CHUNK):
        try:
            parts.append(_decode(buf, starts[lo:lo + _CHUNK], lengths[lo:lo + _CHUNK], specs, fast))
        except ExampleError as e:
            if not lo or e.record is None:
                raise
            raise ExampleError(e.reason, record=e.record + lo) from e
    return parts[0] if len(parts) == 1 else {key: np.concatenate([p[key] for p in parts]) for key in specs}


def _decode(buf, starts, lengths, specs, fast: bool) -> dict[str, np.ndarray]:
    if fast:
        try:
            return _fast(buf, starts, lengths, specs)
        except (Irregular, IndexError):
            pass
    return _general(buf, starts, lengths, specs)


def _fast(buf, starts, lengths, specs) -> dict[str, np.ndarray]:
    try:
        spans = template_layout(buf, starts, lengths, specs)
    except (Irregular, IndexError):
        spans = lockstep_layout(buf, starts, lengths, specs)
    return extract(buf, spans, specs, starts.shape[0])


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
