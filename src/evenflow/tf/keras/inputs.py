"""What ``evenflow.tf.fit`` trains on: arrays like ``model.fit``'s, or any evenflow source; and the validation split.

:class:`ArrayPair` is a TensorFlow source over ``x`` and ``y`` as ``model.fit`` takes them:
arrays, or dicts/lists of arrays for models with several inputs or outputs, labels of any
dtype (class ids, one-hot rows, regression targets). Integer class ids ``[N]`` become the
index's labels, which ``stratify=True`` needs.

:func:`split_validation` follows ``model.fit(validation_split=f)``: the *last* ``f`` of the
samples, before any shuffling, are held out (``floor(N * (1 - f))`` samples train), so a
program that moves from ``model.fit`` to ``evenflow.tf.fit`` validates on the same samples.
"""
from __future__ import annotations

import collections.abc
import math

import numpy as np

from evenflow.data.source import Source, SubsetSource
from evenflow.plan.index import Index
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf


def _leaves(structure, what: str) -> list:
    tf = _tf()
    leaves = tf.nest.flatten(structure)
    if not leaves:
        raise ValueError(f"{what} holds no arrays")
    return leaves


class ArrayPair:
    """A :class:`~evenflow.tf.input.sources.TensorSource` over ``x`` and ``y`` (see the module docstring).

    Raises:
        ValueError: the arrays do not all have the same first dimension N >= 1.
    """

    def __init__(self, x, y):
        tf = _tf()
        self._x = tf.nest.map_structure(_as_array, _tuples(x))
        self._y = tf.nest.map_structure(_as_array, _tuples(y))
        counts = sorted({len(a) if a.ndim else 0 for a in _leaves(self._x, "x") + _leaves(self._y, "y")})
        if len(counts) != 1 or counts[0] == 0:
            raise ValueError(f"x and y must be arrays with the same number of samples N >= 1 in their first "
                             f"dimension, got first dimensions {counts}; pass one row per sample")
        self.num_samples = counts[0]
        y_leaves = _leaves(self._y, "y")
        single = y_leaves[0] if len(y_leaves) == 1 else None
        self._labels = single.astype(np.int64) if single is not None and single.ndim == 1 \
            and single.dtype.kind in "iub" else None
        self._tensors = None

    @property
    def feature_shape(self):
        leaves = _leaves(self._x, "x")
        return tuple(leaves[0].shape[1:]) if len(leaves) == 1 else None

    def index(self) -> Index:
        return Index(self.num_samples, labels=self._labels)

    def label_kind(self) -> str:
        """What ``y`` is, in words (for the refusal of stratification without integer labels)."""
        leaves = _leaves(self._y, "y")
        if len(leaves) != 1:
            return f"{len(leaves)} arrays"
        a = leaves[0]
        return f"an array of {'floats' if a.dtype.kind == 'f' else a.dtype} of shape {a.shape}"

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._tensors is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._tensors = tf.nest.map_structure(tf.convert_to_tensor, (self._x, self._y))
        x, y = tf.nest.map_structure(lambda t: tf.gather(t, ids), self._tensors)
        return {"features": x, "label": y}

    def __repr__(self):
        return f"ArrayPair(num_samples={self.num_samples})"


def _tuples(structure):
    """Every list of arrays as a tuple: ``tf.data`` stacks a list into one tensor, and a list of
    inputs of different shapes (``model.fit(x=[a, b])`` for two inputs) would not stack; a tuple
    stays a structure, and Keras reads it as it reads the list."""
    if isinstance(structure, list) and _numbers(structure):
        return np.asarray(structure)  # rows of plain numbers: one array, as numpy reads them
    if isinstance(structure, (list, tuple)) and not hasattr(structure, "_fields"):
        return tuple(_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _tuples(v) for k, v in structure.items()}
    return structure


def _numbers(rows: list) -> bool:
    """Whether a list holds plain numbers (or lists of them) rather than one array per input."""
    first = rows
    while isinstance(first, list) and first:
        first = first[0]
    return isinstance(first, (int, float, bool, np.generic))


def _as_array(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    if a.dtype.kind not in "iufb":
        raise TypeError(f"model inputs and targets must be numeric arrays, got dtype {a.dtype}")
    return a


def as_source(x, y, what: str):
    """A TensorFlow source from ``x, y`` arrays, or ``x`` itself when it is an evenflow source (``y`` None)."""
    if isinstance(x, Source) and hasattr(x, "batch") and not isinstance(x, np.ndarray):
        if y is not None:
            raise ValueError(f"{what}: y must be None when x is an evenflow source (it holds the labels), "
                             f"got {type(y).__name__}")
        return x
    if _streamed(x):
        raise ValueError(f"{what}: got a {type(x).__name__}, which yields batches in its own order, and a plan reads "
                         f"samples by id: pass the arrays x and y, an evenflow source as x, or for TFRecord files your "
                         f"tf.data map functions through evenflow.tf.RecordChain (docs/tensorflow.md)")
    if x is None or y is None:
        raise ValueError(f"{what}: pass arrays x and y, or an evenflow source as x")
    return ArrayPair(x, y)


def _streamed(x) -> bool:
    """Whether ``x`` is read in order only: a ``tf.data.Dataset``, a generator, an iterator or a ``keras.utils.PyDataset``."""
    tf, keras = _tf(), _keras()
    return isinstance(x, (tf.data.Dataset, keras.utils.PyDataset, collections.abc.Iterator))


def split_validation(source, fraction: float):
    """``(train, validation)`` sources: the last ``fraction`` of the samples validate, as in ``model.fit``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation_split must be a float in [0, 1), got {fraction!r}")
    n = source.num_samples
    split_at = int(math.floor(n * (1.0 - fraction)))
    if fraction == 0:
        return source, None
    if split_at < 1 or split_at >= n:
        raise ValueError(f"validation_split={fraction} of {n} samples leaves {split_at} to train and {n - split_at} "
                         f"to validate; both need at least 1: use more samples or another fraction")
    return SubsetSource(source, np.arange(split_at)), SubsetSource(source, np.arange(split_at, n))


def as_callbacks(callbacks) -> list:
    """``callbacks`` as ``model.fit`` takes them (None, one callback, or a list of them), as a list."""
    keras = _keras()
    if callbacks is None:
        return []
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]  # one callback: a list of one
    bad = [c for c in items if not isinstance(c, keras.callbacks.Callback)]
    if bad:
        raise TypeError(f"callbacks must be keras.callbacks.Callback objects (one, or a list of them), got "
                        f"{type(bad[0]).__name__}")
    return items


def check_stratify(source, stratify: bool) -> None:
    """Refuse ``stratify=True`` for arrays ``y`` that are not integer class labels, naming what ``y`` is.

    (A source of its own without labels gets the plan's refusal.)
    """
    inner = getattr(source, "source", source)
    if stratify and isinstance(inner, ArrayPair) and inner.index().labels is None:
        raise ValueError(f"stratify=True needs y to be one integer class label per sample (a 1-d int array), "
                         f"got {inner.label_kind()}; pass integer labels or stratify=False")
