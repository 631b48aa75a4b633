"""The models of parameter-server runs: ``tf.Module`` s whose variables the strategy may split.

* :func:`make_mlp`: flatten, two hidden ReLU layers, logits (fixed-size features);
* :func:`make_hashed_text`: a hashed character-trigram embedding (by default 2^20 buckets x 64
  float32, 256 MiB: bigger than a task should hold alone, so the strategy splits it into one
  block of rows per parameter server), mean-pooled over each sequence's real trigrams, then one
  hidden ReLU layer and the logits (token sequences, e.g. ``builtin:stdlib-docs``).

Create them under ``strategy.scope()``. Initial values are drawn from ``seed`` with stateless
random ops, so every run with the same seed starts from the same weights.
"""
from __future__ import annotations

from evenflow.run.options import ScheduleOptions
from evenflow.tf._lazy import tf as _tf
from evenflow.util.validate import check_int

HASH_BUCKETS = 1 << 20
HASH_DIM = 64


def _glorot(tf, shape, seed: int, i: int):
    limit = (6.0 / (shape[0] + shape[1])) ** 0.5
    return tf.random.stateless_uniform(shape, seed=[seed, i], minval=-limit, maxval=limit)


def make_mlp(input_size: int, num_classes: int, hidden: int = 128, seed: int = ScheduleOptions.seed):
    """A ``tf.Module`` classifier: flatten, two hidden ReLU layers of ``hidden``, logits.

    Glorot-uniform kernels drawn from ``seed``, zero biases. Call under ``strategy.scope()``.
    """
    tf = _tf()
    sizes = [int(input_size), int(hidden), int(hidden), int(num_classes)]

    class MLP(tf.Module):
        def __init__(self):
            super().__init__(name="mlp")
            self.kernels, self.biases = [], []
            for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
                self.kernels.append(tf.Variable(_glorot(tf, (a, b), seed, i), name=f"kernel_{i}"))
                self.biases.append(tf.Variable(tf.zeros([b]), name=f"bias_{i}"))

        def __call__(self, x):
            h = tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], sizes[0]])
            for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
                h = tf.matmul(h, w) + b
                if i < len(self.kernels) - 1:
                    h = tf.nn.relu(h)
            return h

    return MLP()


def make_hashed_text(num_classes: int, buckets: int = HASH_BUCKETS, dim: int = HASH_DIM, hidden: int = 128,
                     seed: int = ScheduleOptions.seed):
    """A hashed character-trigram classifier; its inputs are ``(tokens [B, T] int, length [B] int)``.

    Trigram ``(a, b, c)`` of a sequence's first ``length`` tokens goes to bucket
    ``(a * 1000003 + b * 10007 + c * 101) mod buckets``; a sequence shorter than 3 tokens
    pools nothing (a zero vector).
    """
    tf = _tf()
    buckets, dim = check_int("buckets", buckets, 1), check_int("dim", dim, 1)

    class HashedText(tf.Module):
        def __init__(self):
            super().__init__(name="hashed_text")
            table = tf.random.stateless_uniform((buckets, dim), seed=[seed, 100], minval=-0.05, maxval=0.05)
            self.table = tf.Variable(table, name="table")
            self.kernels = [tf.Variable(_glorot(tf, (dim, hidden), seed, 0), name="kernel_0"),
                            tf.Variable(_glorot(tf, (hidden, int(num_classes)), seed, 1), name="kernel_1")]
            self.biases = [tf.Variable(tf.zeros([hidden]), name="bias_0"),
                           tf.Variable(tf.zeros([int(num_classes)]), name="bias_1")]

        def __call__(self, inputs):
            tokens, length = inputs
            t = tf.cast(tokens, tf.int64)
            grams = tf.math.floormod(t[:, :-2] * 1000003 + t[:, 1:-1] * 10007 + t[:, 2:] * 101, buckets)
            inside = tf.range(tf.shape(grams)[1], dtype=tf.int64)[None, :] < tf.cast(length, tf.int64)[:, None] - 2
            weight = tf.cast(inside, tf.float32)[..., None]
            vectors = tf.nn.embedding_lookup(self.table, grams)  # the rows of each parameter server's block
            pooled = tf.reduce_sum(vectors * weight, 1) / tf.maximum(tf.reduce_sum(weight, 1), 1.0)
            h = tf.nn.relu(tf.matmul(pooled, self.kernels[0]) + self.biases[0])
            return tf.matmul(h, self.kernels[1]) + self.biases[1]

    return HashedText()
