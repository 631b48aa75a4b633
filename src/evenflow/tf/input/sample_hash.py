"""Per-sample random numbers and seeds as pure functions of (seed, epoch, stream, sample id).

A counter-based hash (SplitMix64's finaliser chained over seed, epoch, stream, id and draw
number), computed with vectorised uint64 ops on a whole batch: no random state anywhere, so a
sample draws the same numbers whichever replica and slot it lands in and however often a run
is resumed, and a new epoch draws new ones. :func:`sample_uniform` gives uniform floats (the
built-in augmentations of :mod:`evenflow.tf.input.augment`); :func:`sample_seeds` gives seeds for
TensorFlow's stateless random ops (``tf.random.stateless_uniform``,
``tf.image.stateless_random_flip_left_right``, ...) in a user's own augment function.

:func:`evenflow.data.augment.sample_uniform` computes the same numbers in numpy.
"""
from __future__ import annotations

from evenflow.tf._lazy import tf as _tf

# SplitMix64 (Steele, Lea & Flood 2014): a golden-ratio increment and a finaliser that
# passes BigCrush when used as a counter-based generator.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

# The stream of the seeds handed to a user's augment function; the built-in augmentations
# use 1-5 (evenflow.data.augment_policy.STREAMS), so their draws are independent of these.
SEED_STREAM = 101


def _mix64(tf, x):
    """SplitMix64's finaliser on a uint64 tensor (wrapping arithmetic)."""
    shift = tf.bitwise.right_shift
    x = tf.bitwise.bitwise_xor(x, shift(x, tf.constant(30, tf.uint64))) * tf.constant(_MIX1, tf.uint64)
    x = tf.bitwise.bitwise_xor(x, shift(x, tf.constant(27, tf.uint64))) * tf.constant(_MIX2, tf.uint64)
    return tf.bitwise.bitwise_xor(x, shift(x, tf.constant(31, tf.uint64)))


def _combine(tf, h, value):
    """Hash ``value`` (int64 tensor, any shape) into the running uint64 hash ``h``."""
    v = tf.bitcast(tf.cast(value, tf.int64), tf.uint64)
    return _mix64(tf, tf.bitwise.bitwise_xor(h, v) + tf.constant(_GOLDEN, tf.uint64))


def sample_hash(seed: int, epoch, stream: int, ids, count: int):
    """uint64 ``ids.shape + [count]``: ``count`` hashed draws per sample id."""
    tf = _tf()
    h = _combine(tf, tf.constant(_GOLDEN, tf.uint64), tf.constant(seed, tf.int64))
    h = _combine(tf, h, epoch)
    h = _combine(tf, h, tf.constant(stream, tf.int64))
    h = _combine(tf, h, ids)
    draws = tf.range(1, count + 1, dtype=tf.int64)
    return _combine(tf, h[..., None], draws)


def sample_uniform(batch: dict, seed: int, stream: int, count: int):
    """float32 ``[slots, count]`` uniform in [0, 1), a pure function of (seed, epoch, id, stream).

    Vectorised over the batch: no per-sample op. Each value has 24 random bits.
    """
    tf = _tf()
    v = sample_hash(seed, batch["epoch"], stream, tf.reshape(batch["id"], [-1]), count)
    return tf.cast(tf.bitwise.right_shift(v, tf.constant(40, tf.uint64)), tf.float32) * (1.0 / (1 << 24))


def sample_seeds(seed: int, epoch, ids):
    """int64 ``ids.shape + [2]``: one seed for TensorFlow's stateless random ops per sample id.

    A pure function of (seed, epoch, id): the same sample gets the same seed on any number of
    replicas and after a resume, and a new one each epoch. Padding slots (id -1) get the seed
    of id -1, which the mask ignores.
    """
    tf = _tf()
    return tf.bitcast(sample_hash(seed, epoch, SEED_STREAM, ids, 2), tf.int64)
