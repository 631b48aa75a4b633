"""``tf.train.Example`` encoding without TensorFlow.

An Example is a map from feature key to one of three lists: ``float_list`` (float32),
``int64_list`` or ``bytes_list``; a :class:`~evenflow.records.example.spec.FeatureSpec` fixes a
key's list type and per-sample shape.

Encoding is a hand-written protobuf wire encoder: keys in sorted order, lists packed,
which is byte for byte what ``tf.train.Example.SerializeToString(deterministic=True)``
produces (a test checks this). It is faster than filling protobuf messages because a
fixed-size float feature is one constant prefix plus ``array.tobytes()``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from evenflow.records.example.spec import FeatureSpec

# Feature oneof field number -> our dtype name; the wire tag byte is (number << 3) | 2.
_TAG_OF_DTYPE = {"bytes": 0x0A, "float32": 0x12, "int64": 0x1A}


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int below 2**64."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_sizes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed varints of int64 values, vectorised: ``(bytes uint8 [total], bytes per value)``.

    Negative values take 10 bytes (two's complement as uint64), as protobuf writes int64.
    """
    v = np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    owner = np.repeat(np.arange(v.size), nbytes)
    pos = np.arange(owner.size) - np.repeat(np.cumsum(nbytes) - nbytes, nbytes)
    low = (v[owner] >> (7 * pos).astype(np.uint64)) & np.uint64(0x7F)
    more = (pos < nbytes[owner] - 1).astype(np.uint64) << np.uint64(7)
    return (low | more).astype(np.uint8), nbytes


def _varints(values: np.ndarray) -> bytes:
    """Packed varints of int64 values."""
    arr = np.asarray(values)
    if arr.size == 1:
        return _varint(int(arr.reshape(-1)[0].astype(np.int64)) & 0xFFFFFFFFFFFFFFFF)
    return _varint_sizes(arr)[0].tobytes()


def _as_bytes_items(value) -> list[bytes]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [bytes(value)]
    if isinstance(value, str):
        return [value.encode("utf-8")]
    arr = np.asarray(value)
    items = arr.reshape(-1).tolist() if arr.ndim else [arr.item()]
    bad = [x for x in items if not isinstance(x, (str, bytes, bytearray, memoryview))]
    if bad:  # bytes(x) of an int would be x zero bytes, of a dict its keys
        raise TypeError(f"a bytes feature holds bytes or str, got {type(bad[0]).__name__} ({bad[0]!r:.40})")
    return [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in items]


def _list_payload(dtype: str, value) -> bytes:
    """The serialized BytesList/FloatList/Int64List message for ``value``."""
    if dtype == "bytes":
        return b"".join(b"\x0a" + _varint(len(x)) + x for x in _as_bytes_items(value))
    if dtype == "float32":
        packed = np.ascontiguousarray(value, dtype="<f4").tobytes()
    else:
        arr = np.asarray(value)
        if arr.dtype.kind not in "iub":
            raise TypeError(f"int64 feature needs integers, got dtype {arr.dtype}")
        packed = _varints(arr)
    # proto3 omits an empty packed field entirely.
    return b"\x0a" + _varint(len(packed)) + packed if packed else b""


def _entry(key_bytes: bytes, dtype: str, payload: bytes) -> bytes:
    feature = bytes((_TAG_OF_DTYPE[dtype],)) + _varint(len(payload)) + payload
    entry = b"\x0a" + _varint(len(key_bytes)) + key_bytes + b"\x12" + _varint(len(feature)) + feature
    return b"\x0a" + _varint(len(entry)) + entry


def _dtype_of_value(key: str, value) -> str:
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return "bytes"
    arr = np.asarray(value)
    kind = arr.dtype.kind
    if kind == "f":
        return "float32"
    if kind in "iub":
        return "int64"
    if kind == "O":
        big = [x for x in arr.reshape(-1).tolist() if isinstance(x, int)]
        if big:  # numpy keeps Python ints outside int64 as objects
            raise TypeError(f"feature {key!r}: {big[0]} is outside the int64 range of an Example's integers; "
                            f"store it as bytes or str")
    if kind in "SUO":
        return "bytes"
    raise TypeError(f"feature {key!r}: cannot store dtype {arr.dtype} in an Example; use floats, integers or bytes")


def encode_example(features: Mapping[str, object], specs: Mapping[str, FeatureSpec] | None = None) -> bytes:
    """Serialize one ``tf.train.Example``.

    Args:
        features: key -> value: a number, an array (flattened row-major), ``bytes``,
            ``str`` or a list of bytes.
        specs: optional key -> :class:`FeatureSpec` forcing the list type (else floats
            give float_list, integers/bools int64_list, bytes/str bytes_list).

    Returns:
        The serialized Example, equal to TensorFlow's deterministic serialization.

    Raises:
        TypeError: a feature name that is not a string, or a value an Example cannot hold
            (None, a dict, an integer outside int64), naming the feature.
    """
    names = [k for k in features if not isinstance(k, str)]
    if names:
        raise TypeError(f"feature names must be strings, got {type(names[0]).__name__} ({names[0]!r})")
    parts = []
    for key in sorted(features):
        value = features[key]
        dtype = specs[key].dtype if specs and key in specs else _dtype_of_value(key, value)
        try:
            payload = _list_payload(dtype, value)
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"feature {key!r}: {e}; a feature holds numbers (int64 or float32), an array of "
                            f"them, bytes, str or a list of bytes") from None
        parts.append(_entry(key.encode("utf-8"), dtype, payload))
    body = b"".join(parts)
    return b"\x0a" + _varint(len(body)) + body


class ExampleEncoder:
    """Encodes rows of column arrays into Examples, vectorised across rows where it can.

    Every entry header that depends only on a payload length is built once and cached;
    float rows are slices of one ``tobytes()`` of the column and int64 varints are
    encoded for the whole column at once, so the per-record Python work is a join.

    Args:
        specs: key -> :class:`FeatureSpec` of every feature to write.
    """

    def __init__(self, specs: Mapping[str, FeatureSpec]):
        self.specs = dict(specs)
        self._keys = sorted(self.specs)
        self._heads: dict[tuple[str, int], bytes] = {}

    def _head(self, key: str, payload_len: int) -> bytes:
        """Entry bytes up to the packed payload of ``payload_len`` bytes."""
        h = self._heads.get((key, payload_len))
        if h is None:
            spec = self.specs[key]
            fake = b"\x0a" + _varint(payload_len) + bytes(payload_len) if payload_len else b""
            entry = _entry(key.encode("utf-8"), spec.dtype, fake)
            h = self._heads[(key, payload_len)] = entry[:len(entry) - payload_len]
        return h

    def encode(self, row: Mapping[str, object]) -> bytes:
        """One Example from ``row`` (key -> value for this record)."""
        return next(self.encode_rows({k: [row[k]] for k in self._keys}, 0, 1))

    def _column(self, key: str, col, n: int) -> list[bytes]:
        spec = self.specs[key]
        if spec.dtype == "bytes":
            return [_entry(key.encode("utf-8"), "bytes", _list_payload("bytes", col[i])) for i in range(n)]
        arr = np.asarray(col)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"feature {key!r} must be numeric for {spec.dtype}, got dtype {arr.dtype}")
        if spec.dtype == "int64" and arr.dtype.kind == "f":
            raise TypeError(f"feature {key!r} is int64 but holds floats; round them or store float32")
        arr = arr.reshape(n, -1)
        if arr.shape[1] != spec.size:
            raise ValueError(f"feature {key!r} has {arr.shape[1]} values per record, its spec says shape "
                             f"{spec.shape} = {spec.size} values")
        if spec.size == 0:
            return [self._head(key, 0)] * n
        if spec.dtype == "float32":
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
            m = 4 * spec.size
            head = self._head(key, m)
            return [head + raw[i * m:(i + 1) * m] for i in range(n)]
        data, nbytes = _varint_sizes(arr)
        raw = data.tobytes()
        row_len = nbytes.reshape(n, spec.size).sum(axis=1)
        ends = np.cumsum(row_len).tolist()
        lens = row_len.tolist()
        return [self._head(key, m) + raw[e - m:e] for e, m in zip(ends, lens)]

    def encode_rows(self, columns: Mapping[str, object], start: int, stop: int):
        """Yield the Examples of rows ``start..stop-1`` of column arrays ``[N, *shape]``."""
        n = stop - start
        per_key = [self._column(k, columns[k][start:stop], n) for k in self._keys]
        for parts in zip(*per_key):
            body = b"".join(parts)
            yield b"\x0a" + _varint(len(body)) + body
