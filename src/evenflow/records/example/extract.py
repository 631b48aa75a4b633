"""Gathering the values of every feature of a batch of Examples from where they lie.

Given the spans :mod:`evenflow.records.example.layout` located, float payloads are
gathered with one fancy index and viewed as float32, int64 varints are decoded in bulk,
and bytes items are sliced out. A variable-length list (spec shape ``(None,)``) is
gathered the same way for the whole batch, counted per record, and split into one array
per record (:func:`ragged_values`, :func:`split_rows`). Anything unexpected (a payload of
another size, a varint that runs past its record) raises
:class:`~evenflow.records.example.layout.Irregular`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from evenflow.records.example.layout import Irregular
from evenflow.records.example.spec import FeatureSpec


def extract(buf, spans: dict, specs: Mapping[str, FeatureSpec], b: int) -> dict[str, np.ndarray]:
    """Gather every feature's values for the whole batch from the located spans."""
    out = {}
    for key, spec in specs.items():
        span = spans[key]
        if spec.varlen:
            out[key] = split_rows(*ragged_values(buf, span, spec.dtype))
        elif spec.dtype == "float32":
            pstart, plen = span
            if not (plen == 4 * spec.size).all():
                raise Irregular
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
                    raise Irregular
                out[key] = vals.astype(np.int64).reshape((b,) + spec.shape)
                continue
            data = _gather(buf, pstart, plen)
            # Each record's payload must end on a varint boundary and hold spec.size values.
            ends = np.cumsum(plen) - 1
            if (data[ends] >= 0x80).any():
                raise Irregular
            counts = np.add.reduceat((data < 0x80).astype(np.int64), np.cumsum(plen) - plen)
            if not (counts == spec.size).all():
                raise Irregular
            vals = _decode_varints(data, b * spec.size)
            out[key] = vals.reshape((b,) + spec.shape)
        else:
            raw = buf.tobytes()
            arr = np.empty((b, spec.size), dtype=object)
            for j, (s, n) in enumerate(span):
                arr[:, j] = [raw[x:x + m] for x, m in zip(s.tolist(), n.tolist())]
            out[key] = arr.reshape((b,) + spec.shape)
    return out


def ragged_values(buf, span, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Every value of a variable-length float32/int64 list in a batch, and how many each record holds.

    Args:
        buf: the batch's bytes (uint8, padded).
        span: ``(payload starts [B], payload lengths [B])`` of the packed values (length 0: empty).
        dtype: ``"float32"`` or ``"int64"``.

    Returns:
        ``(values float32 or int64 [T], counts int64 [B])``, record after record.
    """
    pstart, plen = span
    data = _gather(buf, pstart, plen)
    if dtype == "float32":
        if (plen % 4).any():
            raise Irregular
        return data.view("<f4").astype(np.float32, copy=False), plen // 4
    ends = np.cumsum(plen)
    # Each record's payload must end on the last byte of a varint.
    if (data[ends[plen > 0] - 1] >= 0x80).any():
        raise Irregular
    last = np.concatenate([[0], np.cumsum(data < 0x80)])
    counts = last[ends] - last[ends - plen]
    return _decode_varints(data, int(counts.sum())), counts


def split_rows(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """object ``[B]``: row i is ``values[sum(counts[:i]):sum(counts[:i + 1])]`` (a view)."""
    out = np.empty(counts.shape[0], dtype=object)
    if not counts.size:
        return out
    for i, row in enumerate(np.split(values, np.cumsum(counts)[:-1])):
        out[i] = row
    return out


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
        raise Irregular
    first = np.empty_like(last)
    first[0] = True
    first[1:] = last[:-1]
    group_starts = np.flatnonzero(first)
    pos = np.arange(data.size) - np.repeat(group_starts, np.diff(np.append(group_starts, data.size)))
    if pos.max() > 9:
        raise Irregular
    parts = (data & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, group_starts).view(np.int64)
