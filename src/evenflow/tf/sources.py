"""Where batches come from: the :class:`Source` protocol and :class:`ArraySource`.

A source is random access by sample id, one whole batch at a time: the reader
hands it the ids of one replica's batch (padding already replaced by valid ids)
and gets back a dict of tensors. Three members are all a source needs —
``num_samples``, ``index()`` and ``batch(ids)`` — so numpy arrays
(:class:`ArraySource`), TFRecord shards
(``evenflow.tf.records_source.RecordSource``) or anything else plug into the same
:class:`~evenflow.tf.reader.PlanReader`.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from evenflow.plan import Index
from evenflow.tf._lazy import tf as _tf

__all__ = ["Source", "ArraySource", "SubsetSource", "RESERVED_KEYS"]

# Keys the reader adds to every batch; a source or map function must not produce them itself.
RESERVED_KEYS = ("id", "mask", "global_real_count", "epoch", "produced")


@runtime_checkable
class Source(Protocol):
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
    """A :class:`Source` over numpy arrays held in memory.

    The arrays become tensors on first use (not in the constructor), so a source
    can be built and validated before TensorFlow's devices are configured.
    Suited to data that fits in memory a few times over: the arrays are copied
    once into TensorFlow's host memory.

    Args:
        features: array ``[N, ...]`` of any numeric dtype.
        labels: integer array ``[N]``.
        costs: optional non-negative array ``[N]`` passed to the index.
        extra: optional dict of further ``[N, ...]`` arrays to return with each batch.
    """

    def __init__(self, features, labels, costs=None, extra: dict | None = None):
        features = np.asarray(features)
        labels = np.asarray(labels)
        if features.ndim < 1 or features.shape[0] < 1:
            raise ValueError(f"features must be an array [N, ...] with N >= 1, got shape {features.shape}")
        n = int(features.shape[0])
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape [N] = ({n},) to match features {features.shape}, "
                             f"got {labels.shape}; pass one integer label per sample")
        if labels.dtype.kind not in "iub":
            raise TypeError(f"labels must be integers, got dtype {labels.dtype}; map classes to 0..K-1 first")
        if features.dtype.kind not in "iufb":
            raise TypeError(f"features must be numeric, got dtype {features.dtype}")
        self._arrays = {"features": features, "label": labels.astype(np.int64)}
        for key, arr in (extra or {}).items():
            arr = np.asarray(arr)
            if key in self._arrays or key in RESERVED_KEYS:
                raise ValueError(f"extra array name {key!r} is taken; choose a name other than "
                                 f"{', '.join(sorted({*self._arrays, *RESERVED_KEYS}))}")
            if arr.ndim < 1 or arr.shape[0] != n:
                raise ValueError(f"extra array {key!r} must have {n} rows like features, got shape {arr.shape}")
            self._arrays[key] = arr
        self.num_samples = n
        self._costs = costs
        self._tensors: dict | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features."""
        return tuple(self._arrays["features"].shape[1:])

    @property
    def labels(self) -> np.ndarray:
        """int64 ``[N]``."""
        return self._arrays["label"]

    def index(self) -> Index:
        return Index(self.num_samples, labels=self._arrays["label"], costs=self._costs)

    def batch(self, ids) -> dict:
        tf = _tf()
        if self._tensors is None:
            # init_scope makes these eager tensors even when first called while tf.data traces
            # the map function; the traced function then captures them instead of baking the
            # arrays into the graph as constants.
            with tf.init_scope(), tf.device("/cpu:0"):
                self._tensors = {k: tf.convert_to_tensor(v) for k, v in self._arrays.items()}
        return {k: tf.gather(t, ids) for k, t in self._tensors.items()}

    def __repr__(self):
        return f"ArraySource(num_samples={self.num_samples}, feature_shape={self.feature_shape})"


class SubsetSource:
    """The samples ``ids`` of another :class:`Source`, renumbered ``0..len(ids)-1``.

    How a train/test split of one records dataset becomes two sources that share the
    files (and, with ``RecordSource(cache=True)``, one in-memory copy): sample ``i`` of
    the subset is sample ``ids[i]`` of ``source``.

    Args:
        source: the full :class:`Source`.
        ids: int array ``[n]`` of distinct sample ids of ``source``, n >= 1.
    """

    def __init__(self, source: Source, ids):
        if not isinstance(source, Source):
            raise TypeError(f"source must follow the evenflow.tf.Source protocol, got {type(source).__name__}")
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size < 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be a non-empty 1-D integer array, got {ids.dtype} of shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= source.num_samples or np.unique(ids).size != ids.size:
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
