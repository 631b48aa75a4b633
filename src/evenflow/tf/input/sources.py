"""Sources as TensorFlow ops: the reader's :class:`TensorSource` protocol, arrays and subsets as tensors.

A TensorFlow source is random access by sample id, one whole batch at a time, like an
:class:`evenflow.data.Source`, but its ``batch(ids)`` takes an int64 tensor and returns
tensors, because the :class:`~evenflow.tf.input.reader.PlanReader` calls it inside a ``tf.data``
map function. :class:`ArrayTensors` serves the arrays of an :class:`evenflow.data.ArraySource`
with one ``tf.gather`` per array; :class:`SubsetTensors` renumbers the samples of another
TensorFlow source. Both are conversions, made by
:func:`evenflow.tf.input.source_adapter.tf_source`, which the reader calls itself.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from evenflow.data.source import ArraySource
from evenflow.plan.index import Index
from evenflow.tf._lazy import tf as _tf


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


class ArrayTensors:
    """The arrays of an :class:`evenflow.data.ArraySource` as a :class:`TensorSource`.

    The arrays become tensors on first use (not when converted), so a source can be
    converted before TensorFlow's devices are configured; they are copied once into
    TensorFlow's host memory.
    """

    def __init__(self, numpy: ArraySource):
        self.numpy = numpy  # the numpy source: its arrays, checked
        self.num_samples = numpy.num_samples
        self._tensors: dict | None = None

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
        return f"ArrayTensors({self.numpy!r})"


class SubsetTensors:
    """The conversion of a subset (an :class:`evenflow.data.SubsetSource`, or an
    :class:`evenflow.data.RecordSource` with ``ids``): sample ``i`` is sample ``ids[i]`` of the
    converted full source, so a train and a test split share one converted source (and, with
    ``RecordSource(cache=True)``, one in-memory copy).

    Args:
        numpy: the subset as :mod:`evenflow.data` holds it: its ``ids`` are checked and its
            ``index()`` is this source's.
        source: the converted full :class:`TensorSource`.
        ids: int64 ``[n]``, the subset's ids in ``source``.
    """

    def __init__(self, numpy, source: TensorSource, ids):
        self.numpy, self.source, self.ids = numpy, source, ids
        self.num_samples = numpy.num_samples
        self._ids = None  # tf.int64 [n], made on first use (after the strategy fixed the devices)

    def index(self) -> Index:
        return self.numpy.index()

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._ids is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._ids = tf.constant(self.ids)
        return self.source.batch(tf.gather(self._ids, ids))

    def __repr__(self):
        return f"SubsetTensors({self.source!r}, num_samples={self.num_samples})"
