"""Variable-length list features in TensorFlow: parsing, the cached column, and padding per batch.

The TensorFlow side of :mod:`evenflow.data.sequences`, used by
:class:`~evenflow.tf.input.records_source.RecordTensors`: a variable-length float32/int64 list
(spec shape ``(None,)``) is parsed with ``tf.io.RaggedFeature`` (or gathered from one ragged
tensor when the dataset is cached), so a replica's batch arrives as a ragged tensor
``[slots, None]``; :func:`pad_sequences` pads it to the longest list of that batch (or the
next of ``pad_lengths``) and adds ``length``, exactly as
:class:`evenflow.data.sequences.PadSequences` does in numpy. The padded features have the
static shape ``[slots, None]``, so a ``tf.function`` traces once for every length.
"""
from __future__ import annotations

import numpy as np

from evenflow.data.text import PAD
from evenflow.records.example.spec import FeatureSpec
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.text import padded_length

_TF_DTYPES = {"float32": "float32", "int64": "int64", "bytes": "string"}


def parse_feature(spec: FeatureSpec):
    """The ``tf.io.parse_example`` feature of ``spec``: fixed length, or ragged for ``(None,)``."""
    tf = _tf()
    dtype = getattr(tf, _TF_DTYPES[spec.dtype])
    if spec.varlen:
        return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
    return tf.io.FixedLenFeature(list(spec.shape), dtype)


def column_tensor(column: np.ndarray, spec: FeatureSpec):
    """One feature of every record as a tensor: ``tf.string`` for bytes, ragged ``[N, None]`` for a
    variable-length list (the decoder's object array of 1-D arrays), else dense ``[N, ...]``."""
    tf = _tf()
    if spec.dtype == "bytes":
        return tf.constant(list(column), dtype=tf.string)
    if spec.varlen:
        lengths = np.fromiter(map(len, column), np.int64, count=len(column))
        values = np.concatenate(list(column)) if len(column) else np.zeros(0, spec.dtype)
        return tf.RaggedTensor.from_row_lengths(tf.constant(values.astype(spec.dtype, copy=False)),
                                                tf.constant(lengths), validate=False)
    return tf.constant(column)


def pad_sequences(pad_lengths: tuple[int, ...] | None = None, shift: int = 0, key: str = "features"):
    """A map function: the ragged lists ``batch[key]`` padded per batch, plus ``length``.

    The TensorFlow twin of :class:`evenflow.data.sequences.PadSequences` (same arguments, same
    batches).

    Args:
        pad_lengths: checked increasing lengths, or None (pad to the batch's longest list, at
            least 1 wide).
        shift: added to every value (1 frees 0 for padding in token ids).
        key: the batch key holding a ``tf.RaggedTensor`` ``[slots, None]``.

    Returns:
        ``fn(batch) -> batch`` with ``batch[key]`` padded ``[slots, L]`` (0 after each list)
        and ``length`` int64 ``[slots]``.
    """

    def fn(batch: dict) -> dict:
        tf = _tf()
        batch = dict(batch)
        rows = batch[key]
        length = tf.cast(rows.row_lengths(), tf.int64)
        width = tf.maximum(padded_length(length, pad_lengths), 1)
        if shift:
            rows = rows.with_flat_values(rows.flat_values + tf.cast(shift, rows.dtype))
        batch[key] = rows.to_tensor(default_value=tf.cast(PAD, rows.dtype),
                                    shape=tf.stack([rows.nrows(out_type=tf.int64), width]))
        batch["length"] = length
        return batch

    return fn
