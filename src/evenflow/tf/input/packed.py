"""Packed text in TensorFlow: a replica's ``tf.data`` pipeline of a packed plan, and a model that reads it.

:func:`packed_dataset` reads one replica's row of a packed plan (``Plan(..., pack=L)``)
and yields the batches of :mod:`evenflow.data.packed` — ``features``, ``segment_ids`` and
``positions`` ``[rows, L]``; ``label``, ``length``, ``id``, ``mask`` ``[slots]``; the step's
``global_real_count`` and ``epoch`` — every one the same static shape, so a
``tf.function`` or XLA step compiles once for the whole run.

:func:`packed_text_cnn` is the TensorFlow twin of :func:`evenflow.torch.text.packed_text_cnn`:
every convolution tap that would reach into another sample (or padding) reads zero, and
each sample is pooled over its own tokens, so its logits are the same whether it is packed
alone or with others.
"""
from __future__ import annotations

import numpy as np

from evenflow.data.packed import check_packed_source, check_text_cnn
from evenflow.data.text import VOCAB_SIZE
from evenflow.plan import Cursor, Plan
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import numpy_function
from evenflow.util.validate import check_int

_KEYS = ("features", "segment_ids", "positions", "label", "length")


def _columns(plan: Plan, replica: int, start: Cursor, epochs: int) -> dict:
    cols = {k: [] for k in ("id", "starts", "row", "global_real_count", "epoch")}
    for epoch in range(start.epoch, start.epoch + epochs):
        ep = plan.epoch(epoch, start=start if epoch == start.epoch else None)
        cols["id"].append(ep.ids[:, replica])
        cols["starts"].append(ep.starts[:, replica])
        cols["row"].append(ep.row[:, replica])
        cols["global_real_count"].append(ep.global_real_counts)
        cols["epoch"].append(np.full(ep.num_steps, epoch, np.int64))
    return {k: np.concatenate(v) for k, v in cols.items()}


def packed_dataset(source, plan: Plan, replica: int, start: Cursor | None = None, epochs: int = 1):
    """The ``tf.data.Dataset`` of replica ``replica``'s packed batches, one per global step.

    Args:
        source: a source with ``packed(ids, starts, row, rows, length)``, such as
            :class:`evenflow.data.TextSource`.
        plan: a packed plan (``pack > 0``).
        replica: in ``[0, R)``.
        start: first step (default ``Cursor(0, 0)``).
        epochs: epochs to read from ``start.epoch``, planned now, >= 1.

    Raises:
        TypeError, ValueError: an unpacked plan, a source without ``packed`` or not the one the
            plan was made for (its size, its token lengths), or a bad replica, start or epochs.
    """
    tf = _tf()
    if not plan.options.pack:
        raise ValueError("packed_dataset reads a packed plan; plan with Plan(..., pack=L), or read an unpacked "
                         "plan with evenflow.tf.PlanReader")
    check_packed_source(source, plan)
    check_int("replica", replica, 0, plan.topology.replicas - 1, fix="one of the plan's replicas")
    check_int("epochs", epochs, 1, fix="epochs to read from start.epoch")
    if start is not None and not isinstance(start, Cursor):
        raise TypeError(f"start must be an evenflow Cursor or None, got {start!r}")
    replica, epochs = int(replica), int(epochs)
    start = Cursor(0, 0) if start is None else start
    rows, length, slots = plan.rows, plan.options.pack, plan.slots
    id_dtype = tf.as_dtype(source.data.id_dtype)

    def load(ids, starts, row):
        b = source.packed(ids, starts, row, rows, length)
        return [b[k] for k in _KEYS]

    def batch(cols):
        out = numpy_function(load, [cols["id"], cols["starts"], cols["row"]],
                             [id_dtype, tf.int32, tf.int32, tf.int64, tf.int64])
        shapes = ([rows, length],) * 3 + ([slots],) * 2
        batch = {k: tf.ensure_shape(t, s) for k, t, s in zip(_KEYS, out, shapes)}
        batch.update(id=cols["id"], mask=tf.cast(cols["id"] >= 0, tf.float32),
                     global_real_count=cols["global_real_count"], epoch=cols["epoch"])
        return batch

    ds = tf.data.Dataset.from_tensor_slices(_columns(plan, replica, start, epochs))
    return ds.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(4)


def packed_text_cnn(num_classes: int, vocab_size: int = VOCAB_SIZE, embed: int = 32, width: int = 64,
                    kernel: int = 5):
    """A ``keras.Model`` called as ``model((features, segment_ids), slots=n)`` -> float32 logits ``[slots, K]``.

    Raises:
        ValueError: a size that is not an int >= 1, or an even ``kernel`` (see
            :func:`evenflow.data.packed.check_text_cnn`).
    """
    num_classes, vocab_size, embed, width, kernel = check_text_cnn(num_classes, vocab_size, embed, width, kernel)
    keras = _keras()
    tf = _tf()
    half = kernel // 2

    class PackedTextCNN(keras.Model):
        def __init__(self):
            super().__init__(name="packed_text_cnn")
            self.embed = keras.layers.Embedding(vocab_size, embed)
            self.conv1 = keras.layers.Dense(width, activation="relu")
            self.conv2 = keras.layers.Dense(width, activation="relu")
            self.logits = keras.layers.Dense(num_classes, dtype="float32")

        def _conv(self, layer, x, same):
            length = tf.shape(x)[1]
            padded = tf.pad(x, [[0, 0], [half, half], [0, 0]])
            taps = tf.stack([padded[:, o:o + length] for o in range(kernel)], axis=2)  # [rows, L, kernel, C]
            taps = taps * same[..., None]
            return layer(tf.reshape(taps, [tf.shape(x)[0], length, kernel * x.shape[-1]]))

        def call(self, inputs, slots, training=False):
            tokens, seg = inputs
            seg = tf.cast(seg, tf.int32)
            length = tf.shape(seg)[1]
            padded = tf.pad(seg, [[0, 0], [half, half]])
            near = tf.stack([padded[:, o:o + length] for o in range(kernel)], axis=2)
            same = tf.cast((near == seg[..., None]) & (seg[..., None] > 0), tf.float32)
            h = self._conv(self.conv1, self.embed(tf.cast(tokens, tf.int32)), same)
            h = self._conv(self.conv2, h, same)
            h = tf.reshape(h, [-1, width])
            ids = tf.reshape(seg, [-1]) - 1  # padding -> -1: dropped by the segment ops
            count = tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float32), ids, slots)
            mean = tf.math.unsorted_segment_sum(h, ids, slots) / tf.maximum(count, 1.0)[:, None]
            top = tf.where(count[:, None] > 0, tf.math.unsorted_segment_max(h, ids, slots), 0.0)
            return self.logits(tf.concat([mean, top], axis=1))

    model = PackedTextCNN()
    model((np.ones((1, 1), np.int32), np.ones((1, 1), np.int32)), slots=1)  # build the variables
    return model
