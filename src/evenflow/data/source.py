"""Where batches come from, framework-free: the :class:`Source` protocol, arrays and subsets.

A source is random access by sample id, one whole batch at a time: a reader hands it the
ids of one replica's batch (padding already replaced by valid ids) and gets back a dict of
numpy arrays. Three members are all a source needs — ``num_samples``, ``index()`` and
``batch(ids)`` — so numpy arrays (:class:`ArraySource`), token sequences
(:class:`~evenflow.data.text.TextSource`), records (:class:`~evenflow.data.records_source.RecordSource`)
or anything else plug into every framework's reader: PyTorch's ``PlanLoader`` calls
``batch`` in its workers, and ``evenflow.tf.tf_source`` turns a source into TensorFlow ops
(a fast path for the sources above, ``tf.numpy_function`` for any other).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from evenflow.plan.index import Index
from evenflow.util.distinct import all_distinct
from evenflow.util.ids import sample_ids

# Keys the readers add to every batch; a source or a map function must not produce them itself.
RESERVED_KEYS = ("id", "mask", "global_real_count", "epoch", "step", "produced")


@runtime_checkable
class Source(Protocol):
    """Random access to a dataset by sample id.

    Attributes:
        num_samples: N; valid ids are ``0..N-1``.
    """

    num_samples: int

    def index(self) -> Index:
        """The planner's view: N and optionally labels and costs."""

    def batch(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Load samples ``ids`` (int64 ``[slots]``, each in ``0..N-1``, repeats allowed).

        Returns:
            A dict of numpy arrays with leading axis ``slots``, at least ``"features"``
            and ``"label"``, in the order of ``ids``, and none of :data:`RESERVED_KEYS`.
        """


class ArraySource:
    """A :class:`Source` over numpy arrays held in memory.

    With ``fork`` (Linux's default start method) DataLoader workers share the arrays with
    the main process without copying them; ``evenflow.tf.tf_source`` copies them once into
    TensorFlow's host memory.

    Args:
        features: array ``[N, ...]`` of any numeric dtype (float64 becomes float32).
        labels: integer array ``[N]`` (stored as int64).
        costs: optional non-negative array ``[N]`` passed to the index.
        extra: optional dict of further ``[N, ...]`` arrays to return with each batch.

    Raises:
        ValueError, TypeError: arrays of the wrong shape or dtype, or an ``extra`` name
            that is taken.
    """

    def __init__(self, features, labels, costs=None, extra: dict | None = None):
        features = np.asarray(features)
        labels = np.asarray(labels)
        if features.ndim < 1 or features.shape[0] < 1:
            raise ValueError(f"features must be an array [N, ...] with N >= 1, got shape {features.shape}")
        n = int(features.shape[0])
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape [N] = ({n},) to match the features {features.shape}, "
                             f"got {labels.shape}; pass one integer label per sample")
        if labels.dtype.kind not in "iub":
            raise TypeError(f"labels must be integers, got dtype {labels.dtype}; map classes to 0..K-1 first")
        if features.dtype.kind not in "iufb":
            raise TypeError(f"features must be numeric, got dtype {features.dtype}")
        if features.dtype == np.float64:
            features = features.astype(np.float32)
        self._arrays = {"features": features, "label": labels.astype(np.int64, copy=False)}
        for key, arr in (extra or {}).items():
            arr = np.asarray(arr)
            if key in self._arrays or key in RESERVED_KEYS:
                raise ValueError(f"extra array name {key!r} is taken; choose a name other than "
                                 f"{', '.join(sorted({*self._arrays, *RESERVED_KEYS}))}")
            if arr.ndim < 1 or arr.shape[0] != n:
                raise ValueError(f"extra array {key!r} must have {n} rows like features, got shape {arr.shape}")
            self._arrays[key] = arr
        self.num_samples = n
        self.costs = costs

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """name -> array ``[N, ...]``: ``features``, ``label`` and the extra arrays (a new dict, the same arrays)."""
        return dict(self._arrays)

    @property
    def features(self) -> np.ndarray:
        """``[N, ...]``."""
        return self._arrays["features"]

    @property
    def labels(self) -> np.ndarray:
        """int64 ``[N]``."""
        return self._arrays["label"]

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features."""
        return tuple(int(d) for d in self._arrays["features"].shape[1:])

    def index(self) -> Index:
        return Index(self.num_samples, labels=self.labels, costs=self.costs)

    def batch(self, ids: np.ndarray) -> dict:
        return {k: v[ids] for k, v in self._arrays.items()}

    def __repr__(self):
        return f"ArraySource(num_samples={self.num_samples}, feature_shape={self.feature_shape})"


class SubsetSource:
    """The samples ``ids`` of another :class:`Source`, renumbered ``0..len(ids)-1``.

    How a train/test split of one dataset becomes two sources that share it: sample ``i``
    of the subset is sample ``ids[i]`` of ``source``.

    Args:
        source: the full :class:`Source`.
        ids: int array ``[n]`` of distinct sample ids of ``source``, n >= 1.

    Raises:
        TypeError: ``source`` does not follow the :class:`Source` protocol.
        ValueError: ``ids`` empty, not 1-D integers, out of range or repeated.
    """

    def __init__(self, source: Source, ids):
        if not isinstance(source, Source):
            raise TypeError(f"source must follow the evenflow Source protocol (num_samples, index(), batch(ids)), "
                            f"got {type(source).__name__}")
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size < 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be a non-empty 1-D integer array, got {ids.dtype} of shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= source.num_samples or not all_distinct(ids):
            raise ValueError(f"ids must be distinct sample ids in 0..{source.num_samples - 1}")
        self.source, self.ids = source, ids.astype(np.int64)
        self.num_samples = int(ids.size)

    @property
    def feature_shape(self):
        """The full source's ``feature_shape`` (an AttributeError if it has none)."""
        return self.source.feature_shape

    def index(self) -> Index:
        full = self.source.index()
        return Index(self.num_samples, labels=None if full.labels is None else full.labels[self.ids],
                     costs=None if full.costs is None else full.costs[self.ids])

    def batch(self, ids: np.ndarray) -> dict:
        # numpy would read -1 as the last id: refused, as the full source refuses it
        return self.source.batch(self.ids[sample_ids(np.asarray(ids, dtype=np.int64), self.num_samples)])

    def __repr__(self):
        return f"SubsetSource({self.source!r}, num_samples={self.num_samples})"
