"""Variable-length sequences in TensorFlow, and a small text classifier that ignores padding.

:class:`TextTensors` is what ``evenflow.tf.tf_source`` makes of an :class:`evenflow.data.TextSource`:
the sequences live in one ragged tensor and ``batch(ids)`` gathers one replica's rows and pads
them only to the longest sequence *of that batch* (0 = padding), or to the next of
``pad_lengths``, as :mod:`evenflow.data.text` defines. :func:`decode_text` does the
same for the bytes of text records.

Under ``tf.distribute`` each replica's pipeline is separate (``PER_REPLICA``
input), so the replicas of one step get batches of different lengths. The
features' static shape is ``[slots, None]``: the trainer's ``tf.function`` traces
once and runs every length without retracing (checked in ``tests/tf/test_text.py``).

:func:`text_cnn` (``--model text_cnn``) embeds tokens (bytes, or ids of any vocabulary), runs two 1-D
convolutions and pools with a token mask rebuilt from the ids (``id != 0``).
Padding positions are zeroed before every convolution — exactly what the
convolution's own "same" padding feeds at a sequence's true end — and excluded
from the mean and max pooling, so a sample's logits do not depend on how much
padding its batch gave it. Rows with no token at all are skipped (their logits
are 0): with :func:`blank_padding_rows` as a reader map function, the spare
padding slots of a cost-balanced plan cost nothing.
"""
from __future__ import annotations

import functools

import numpy as np

from evenflow.data.text import PAD, VOCAB_SIZE, TextSource
from evenflow.plan.index import Index
from evenflow.run.models import EMBED_SIZE
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf


class TextTensors:
    """An :class:`evenflow.data.TextSource` as a TensorFlow :class:`~evenflow.tf.input.sources.TensorSource`.

    The same batches (see there), with the sequences in one ragged tensor, so ``batch(ids)``
    gathers one replica's rows and pads them inside the pipeline.
    """

    def __init__(self, numpy: TextSource):
        self.numpy = numpy  # the numpy source: its data and checked pad lengths
        self.data, self.pad_lengths, self.num_samples = numpy.data, numpy.pad_lengths, numpy.num_samples
        self._tensors = None

    def index(self) -> Index:
        return self.numpy.index()

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._tensors is None:
            # Eager tensors captured by the traced map function (see ArrayTensors.batch).
            with tf.init_scope(), tf.device("/cpu:0"):
                rows = tf.RaggedTensor.from_row_splits(tf.constant(self.data.tokens.astype(self.data.id_dtype)),
                                                       tf.constant(self.data.offsets), validate=False)
                self._tensors = (rows, tf.constant(self.data.labels), tf.constant(self.data.lengths))
        rows, labels, lengths = self._tensors
        picked = tf.gather(rows, ids)
        length = tf.gather(lengths, ids)
        longest = padded_length(length, self.pad_lengths)
        features = picked.to_tensor(default_value=PAD, shape=tf.stack([tf.shape(ids, out_type=tf.int64)[0], longest]))
        return {"features": features, "label": tf.gather(labels, ids), "length": length}

    def __repr__(self):
        return f"TextTensors({self.numpy!r})"


def padded_length(length, pad_lengths):
    """int64 scalar: the batch's longest ``length``, or the smallest of ``pad_lengths`` that holds it."""
    tf = _tf()
    longest = tf.reduce_max(length)
    if pad_lengths is not None:
        bounds = tf.constant(pad_lengths, tf.int64)
        longest = tf.gather(bounds, tf.reduce_min(tf.where(bounds >= longest)))
    return longest


def decode_text(pad_lengths: tuple[int, ...] | None = None, key: str = "image"):
    """A map function: UTF-8 bytes ``batch[key]`` (tf.string ``[slots]``) -> token ids, padded per batch.

    For text records written by ``evenflow convert`` (one ``bytes`` feature per
    record, which :class:`~evenflow.tf.input.records_source.RecordTensors` returns under
    ``"image"``): the TensorFlow twin of :class:`evenflow.data.text.DecodeText`. Token
    ids are ``byte + 1`` as in :mod:`evenflow.data.text`, padded with 0 like
    :meth:`TextTensors.batch`, so the batch is the same one the builtin dataset gives for
    the same samples.

    Args:
        pad_lengths: checked increasing lengths (:func:`evenflow.data.text.check_pad_lengths`), or None.
        key: the batch key holding the bytes; it is removed from the batch.

    Returns:
        ``fn(batch) -> batch`` adding ``features`` int32 ``[slots, L]`` and ``length``
        int64 ``[slots]``.
    """

    def fn(batch: dict) -> dict:
        tf = _tf()
        batch = dict(batch)
        text = batch.pop(key)
        length = tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64)
        longest = padded_length(length, pad_lengths)
        # decode_raw pads with 0 bytes; the mask keeps them apart from real 0 bytes (token 1).
        raw = tf.io.decode_raw(text, tf.uint8, fixed_length=tf.cast(longest, tf.int32))
        real = tf.range(tf.shape(raw, out_type=tf.int64)[1])[None, :] < length[:, None]
        batch["features"] = tf.where(real, tf.cast(raw, tf.int32) + 1, PAD)
        batch["length"] = length
        return batch

    return fn


@functools.cache
def _layers():
    """The custom layers, defined on first use so importing this module needs no Keras."""
    keras = _keras()
    ops = keras.ops

    class TokenMask(keras.layers.Layer):
        """ids ``[B, T]`` -> float ``[B, T, 1]``: 1 for tokens, 0 for padding."""

        def call(self, ids):
            return ops.expand_dims(ops.cast(ops.not_equal(ids, PAD), self.compute_dtype), -1)

    class ZeroPadding(keras.layers.Layer):
        """``(x [B, T, C], mask [B, T, 1])`` -> x with padding positions set to 0."""

        def call(self, inputs):
            x, mask = inputs
            return x * ops.cast(mask, x.dtype)

    class MaskedPool(keras.layers.Layer):
        """``(x [B, T, C], mask [B, T, 1])`` -> ``[B, 2C]``: mean and max over real tokens only."""

        def call(self, inputs):
            x, mask = inputs
            mask = ops.cast(mask, x.dtype)
            count = ops.maximum(ops.sum(mask, axis=1), 1.0)
            mean = ops.sum(x * mask, axis=1) / count
            # Padding never wins the max: it is replaced by the dtype's lowest value first.
            low = ops.cast(np.finfo(np.float16).min, x.dtype)
            # tf, not keras.ops: keras.ops.max refuses an empty batch (a replica without real samples).
            peak = _tf().reduce_max(ops.where(mask > 0, x, low), axis=1)
            return ops.concatenate([mean, peak], axis=-1)

    return TokenMask, ZeroPadding, MaskedPool


def blank_padding_rows(batch: dict) -> dict:
    """A :class:`~evenflow.tf.input.reader.PlanReader` map function: padding slots become empty rows.

    The reader fills a padding slot with a copy of a real sample of the batch (so every
    op sees valid data); :func:`text_cnn` skips rows without tokens, so blanking those
    copies saves their compute — cost-balanced plans have ~20% spare slots per replica.
    """
    tf = _tf()
    keep = batch["mask"] > 0
    out = dict(batch)
    out["features"] = tf.where(keep[:, None], batch["features"], tf.zeros_like(batch["features"]))
    if "length" in batch:
        out["length"] = tf.where(keep, batch["length"], tf.zeros_like(batch["length"]))
    return out


def _sequence_net(num_classes, dtype, width, embed, dropout: float = 0.0, vocab_size: int = VOCAB_SIZE):
    keras = _keras()
    layers = keras.layers
    TokenMask, ZeroPadding, MaskedPool = _layers()
    ids = keras.Input(shape=(None,), dtype="int32")
    mask = TokenMask(dtype=dtype)(ids)
    x = layers.Embedding(vocab_size, embed, dtype=dtype)(ids)
    x = ZeroPadding(dtype=dtype)([x, mask])
    x = layers.Conv1D(width, 5, padding="same", activation="relu", dtype=dtype)(x)
    x = ZeroPadding(dtype=dtype)([x, mask])
    x = layers.Conv1D(width, 5, padding="same", dilation_rate=2, activation="relu", dtype=dtype)(x)
    x = MaskedPool(dtype=dtype)([x, mask])
    if dropout > 0:
        x = layers.Dropout(dropout, dtype=dtype)(x)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(ids, logits, name="sequence_net")


def text_cnn(input_shape, num_classes, dtype, width: int = 64, embed: int = EMBED_SIZE, dropout: float = 0.0,
             vocab_size: int = VOCAB_SIZE):
    """Token embedding, two masked 1-D convolutions, masked mean+max pooling, logits.

    Rows without any token (padding slots blanked by :func:`blank_padding_rows`) are
    not computed: the network runs on the other rows and their logits are 0.

    Args:
        input_shape: ``(None,)`` (or a fixed length): one sample's token ids.
        num_classes: K logits.
        dtype: a Keras dtype policy for the hidden layers; logits are float32.
        width: convolution channels.
        embed: embedding size.
        dropout: rate of a dropout layer before the logits (0: none).
        vocab_size: embedding rows; ids are ``1..vocab_size-1`` (0 = padding). Default 257:
            bytes shifted by one; token ids ``t`` read as ``t + 1`` need the largest id + 2.

    Returns:
        A ``keras.Model`` mapping int ids ``[B, T]`` to float32 logits ``[B, K]``.
    """
    keras = _keras()
    if len(tuple(input_shape)) != 1:
        raise ValueError(f"text_cnn takes one sequence of token ids per sample, got per-sample shape {input_shape}")

    class TextCNN(keras.Model):
        def __init__(self):
            super().__init__(name="text_cnn")
            self.net = _sequence_net(num_classes, dtype, width, embed, dropout, vocab_size)

        def call(self, ids, training=False):
            tf = _tf()
            ids = tf.cast(ids, tf.int32)
            rows = tf.where(tf.reduce_any(ids != PAD, axis=1))  # [M, 1] rows holding tokens
            real = tf.gather_nd(ids, rows)
            # One blank row more, always: the network never sees an empty batch (a replica whose
            # step holds no token). oneDNN's convolution kernels fail on zero rows; Eigen's do not.
            spare = tf.zeros([1, tf.shape(ids)[1]], tf.int32)
            logits = self.net(tf.concat([real, spare], 0), training=training)[:-1]
            return tf.scatter_nd(rows, logits, tf.stack([tf.shape(ids, out_type=tf.int64)[0], num_classes]))

    model = TextCNN()
    model(np.zeros((1, 1), np.int32) + 1)  # build: the trainer reads the variables before the first step
    return model
