"""Sources as TensorFlow ops: the reader's :class:`TensorSource` protocol, arrays and subsets in memory.

A TensorFlow source is random access by sample id, one whole batch at a time, like an
:class:`evenflow.data.Source`, but its ``batch(ids)`` takes an int64 tensor and returns
tensors, because the :class:`~evenflow.tf.input.reader.PlanReader` calls it inside a ``tf.data``
map function. :class:`ArraySource` serves numpy arrays from memory with one ``tf.gather``
per array; :class:`SubsetSource` renumbers the samples of another source. Any neutral
source becomes one of these (or a ``tf.numpy_function`` around its ``batch``) through
:func:`evenflow.tf.input.source_adapter.tf_source`, which the reader calls itself.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from evenflow.data import source as neutral
from evenflow.data.source import RESERVED_KEYS
from evenflow.plan.index import Index
from evenflow.tf._lazy import tf as _tf
from evenflow.util.distinct import all_distinct

__all__ = ["TensorSource", "ArraySource", "SubsetSource", "RESERVED_KEYS"]


@runtime_checkable
class TensorSource(Protocol):
    """Random access to a dataset by sample id, the reader's only view of the data.

    Attributes:
        num_samples: N; valid ids are ``0..N-1``.
    """

    num_samples: int

    def index(self) -> Index:
        """The planner's view: N and optionally labels and costs."""

    def batch(self, ids) -> dict:
        """Load the samples ``ids`` (int64 tensor ``[slots]``, every id in ``0..N-1``).

        Called inside a ``tf.data`` map function, so it must use TensorFlow ops.

        Returns:
            A dict of tensors with leading axis ``slots``, at least ``"features"``
            and ``"label"``, in the order of ``ids``.
        """


class ArraySource:
    """A TensorFlow :class:`TensorSource` over numpy arrays held in memory.

    The arrays become tensors on first use (not in the constructor), so a source
    can be built and validated before TensorFlow's devices are configured.
    Suited to data that fits in memory a few times over: the arrays are copied
    once into TensorFlow's host memory.

    Args:
        features: array ``[N, ...]`` of any numeric dtype (float64 becomes float32).
        labels: integer array ``[N]``.
        costs: optional non-negative array ``[N]`` passed to the index.
        extra: optional dict of further ``[N, ...]`` arrays to return with each batch.

    Raises:
        ValueError, TypeError: as :class:`evenflow.data.ArraySource`, which checks the arrays.
    """

    def __init__(self, features, labels, costs=None, extra: dict | None = None):
        self._init(neutral.ArraySource(features, labels, costs=costs, extra=extra))

    def _init(self, numpy: neutral.ArraySource) -> None:
        self.numpy = numpy  # the numpy source: its arrays, checked
        self.num_samples = numpy.num_samples
        self._tensors: dict | None = None

    @classmethod
    def from_source(cls, source: neutral.ArraySource) -> "ArraySource":
        """The TensorFlow view of a numpy :class:`evenflow.data.ArraySource` (the same arrays, not copied)."""
        out = cls.__new__(cls)
        out._init(source)
        return out

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features."""
        return self.numpy.feature_shape

    @property
    def labels(self) -> np.ndarray:
        """int64 ``[N]``."""
        return self.numpy.labels

    def index(self) -> Index:
        return self.numpy.index()

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._tensors is None:
            # init_scope makes these eager tensors even when first called while tf.data traces
            # the map function; the traced function then captures them instead of baking the
            # arrays into the graph as constants.
            with tf.init_scope(), tf.device("/cpu:0"):
                self._tensors = {k: tf.convert_to_tensor(v) for k, v in self.numpy.arrays.items()}
        return {k: tf.gather(t, ids) for k, t in self._tensors.items()}

    def __repr__(self):
        return f"ArraySource(num_samples={self.num_samples}, feature_shape={self.feature_shape})"


class SubsetSource:
    """The samples ``ids`` of another TensorFlow :class:`TensorSource`, renumbered ``0..len(ids)-1``.

    How a train/test split of one records dataset becomes two sources that share the
    files (and, with ``RecordSource(cache=True)``, one in-memory copy): sample ``i`` of
    the subset is sample ``ids[i]`` of ``source``.

    Args:
        source: the full :class:`TensorSource`.
        ids: int array ``[n]`` of distinct sample ids of ``source``, n >= 1.
    """

    def __init__(self, source: TensorSource, ids):
        if not isinstance(source, TensorSource):
            raise TypeError(f"source must follow the evenflow.tf.TensorSource protocol, got {type(source).__name__}")
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size < 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be a non-empty 1-D integer array, got {ids.dtype} of shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= source.num_samples or not all_distinct(ids):
            raise ValueError(f"ids must be distinct sample ids in 0..{source.num_samples - 1}")
        self.source, self.ids = source, ids.astype(np.int64)
        self.num_samples = int(ids.size)
        self._ids = None  # tf.int64 [n], made on first use (after the strategy fixed the devices)

    def index(self) -> Index:
        full = self.source.index()
        return Index(self.num_samples, labels=None if full.labels is None else full.labels[self.ids],
                     costs=None if full.costs is None else full.costs[self.ids])

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._ids is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._ids = tf.constant(self.ids)
        return self.source.batch(tf.gather(self._ids, ids))

    def __repr__(self):
        return f"SubsetSource({self.source!r}, num_samples={self.num_samples})"
