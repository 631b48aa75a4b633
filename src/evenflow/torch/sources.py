"""Where the PyTorch loader's batches come from: numpy arrays or evenflow records.

A source is random access by sample id, one whole batch at a time, returning numpy
arrays (the loader turns them into tensors). It has the same three members as the
TensorFlow sources — ``num_samples``, ``index()`` and ``batch(ids)`` — but no
TensorFlow: :class:`RecordSource` reads TFRecord shards through
:class:`evenflow.records.RecordDataset` (one vectorised gather per shard, numpy
decoding), so it runs inside ``DataLoader`` worker processes.

Sources are pickled into worker processes when the start method is ``spawn``;
:class:`RecordSource` then drops its memory maps and reopens the shards in the
worker on first use.
"""
from __future__ import annotations

import os
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from evenflow.plan import Index

__all__ = ["Source", "ArraySource", "RecordSource", "RESERVED_KEYS"]

# Keys the loader adds to every batch; a source must not produce them itself.
RESERVED_KEYS = ("id", "mask", "global_real_count", "epoch", "step")


@runtime_checkable
class Source(Protocol):
    """Random access to a dataset by sample id.

    Attributes:
        num_samples: N; valid ids are ``0..N-1``.
    """

    num_samples: int

    def index(self) -> Index:
        """The planner's view: N and optionally labels and costs."""

    def batch(self, ids: np.ndarray) -> dict:
        """Load samples ``ids`` (int64 ``[slots]``, each in ``0..N-1``, repeats allowed).

        Returns:
            A dict of numpy arrays with leading axis ``slots``, at least ``"features"``
            and ``"label"``, in the order of ``ids``.
        """


def _check_labels(labels: np.ndarray, n: int) -> np.ndarray:
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape [N] = ({n},) to match the features, got {labels.shape}; "
                         f"pass one integer label per sample")
    if labels.dtype.kind not in "iub":
        raise TypeError(f"labels must be integers, got dtype {labels.dtype}; map classes to 0..K-1 first")
    return labels.astype(np.int64, copy=False)


class ArraySource:
    """A :class:`Source` over numpy arrays held in memory.

    With ``fork`` (Linux's default start method) DataLoader workers share the arrays
    with the main process without copying them.

    Args:
        features: array ``[N, ...]`` of any numeric dtype (float64 becomes float32).
        labels: integer array ``[N]``.
        costs: optional non-negative array ``[N]`` passed to the index.
    """

    def __init__(self, features, labels, costs=None):
        features = np.asarray(features)
        if features.ndim < 1 or features.shape[0] < 1:
            raise ValueError(f"features must be an array [N, ...] with N >= 1, got shape {features.shape}")
        if features.dtype.kind not in "iufb":
            raise TypeError(f"features must be numeric, got dtype {features.dtype}")
        if features.dtype == np.float64:
            features = features.astype(np.float32)
        self.num_samples = n = int(features.shape[0])
        self.features = features
        self.labels = _check_labels(np.asarray(labels), n)
        self._costs = costs

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.features.shape[1:])

    def index(self) -> Index:
        return Index(self.num_samples, labels=self.labels, costs=self._costs)

    def batch(self, ids: np.ndarray) -> dict:
        return {"features": self.features[ids], "label": self.labels[ids]}

    def __repr__(self):
        return f"ArraySource(num_samples={self.num_samples}, feature_shape={self.feature_shape})"


class RecordSource:
    """Random access by sample id to an evenflow records dataset, without TensorFlow.

    Args:
        path: a dataset directory written by ``evenflow convert`` (or its ``dataset.json``), a list
            of TFRecord files with ``.idx`` sidecars, or an open :class:`evenflow.records.RecordDataset`
            (its labels and ``skip_corrupt`` are kept; workers that start by ``spawn`` reopen it
            with the same ``skip_corrupt``).
        feature_key: the numeric feature returned as ``features``; default the only
            feature that is neither the label nor the cost.
        label_key: the integer class feature, returned as ``label``.
        ids: optional subset: sample ``i`` of this source is record ``ids[i]`` (e.g. the
            training part of a split); default every record.
        decode: optional ``fn(batch) -> batch`` run on each batch in the worker, e.g. to
            decode encoded images (a ``bytes`` feature arrives undecoded as ``"image"``).
        scale: optional factor the features are multiplied by (e.g. ``1/16`` for digits).

    Raises:
        RecordError, ValueError: a key the records do not hold (naming the dataset file).
    """

    def __init__(self, path, feature_key: str | None = None, label_key: str = "label", ids=None,
                 decode: Callable[[dict], dict] | None = None, scale: float | None = None):
        from evenflow.records import RecordDataset
        if isinstance(path, RecordDataset):  # already open (e.g. with labels read from plain TFRecords)
            ds = path
            self.path = os.path.dirname(ds.manifest_path) if ds.manifest_path else list(ds.paths)
        else:
            self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else [os.fspath(p) for p in path]
            ds = RecordDataset(self.path)
        self._skip_corrupt = ds.skip_corrupt  # a reopened dataset must leave out the same records
        specs, where = ds.specs, ds.manifest_path or ds.paths[0]
        feature_key = ds.training_keys(feature_key, label_key)
        if specs[feature_key].dtype == "bytes" and decode is None:
            raise ValueError(f"{where}: feature {feature_key!r} holds encoded bytes; pass decode=fn(batch) -> batch "
                             f"that turns batch['image'] into batch['features']")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be a function batch -> batch, got {type(decode).__name__}")
        self.feature_key, self.label_key, self.decode, self.scale = feature_key, label_key, decode, scale
        self.feature_shape = tuple(specs[feature_key].shape)
        self.is_encoded = specs[feature_key].dtype == "bytes"
        self._records = None if ids is None else np.asarray(ids, dtype=np.int64)
        if self._records is not None and self._records.size and (
                self._records.min() < 0 or self._records.max() >= len(ds)):
            raise ValueError(f"ids must be record numbers in 0..{len(ds) - 1}, got {int(self._records.max())}")
        self.num_samples = len(ds) if self._records is None else int(self._records.size)
        labels = ds.labels
        self._labels = None if labels is None else (labels if ids is None else labels[self._records])
        self._costs = None if ds.costs is None else (ds.costs if ids is None else ds.costs[self._records])
        self._ds, self._pid = ds, os.getpid()

    def _dataset(self):
        # A forked worker inherits the maps (valid, read-only); a spawned one gets none.
        if self._ds is None:
            from evenflow.records import RecordDataset
            self._ds, self._pid = RecordDataset(self.path, skip_corrupt=self._skip_corrupt), os.getpid()
        return self._ds

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ds"] = None
        return state

    def index(self) -> Index:
        if self._labels is None:
            return Index(self.num_samples, costs=self._costs)
        return Index(self.num_samples, labels=self._labels, costs=self._costs)

    def batch(self, ids: np.ndarray) -> dict:
        records = ids if self._records is None else self._records[ids]
        cols = self._dataset().decode_batch(records, keys=[self.feature_key, self.label_key])
        feats = cols[self.feature_key]
        out = {"image" if self.is_encoded else "features": feats,
               "label": cols[self.label_key].reshape(-1).astype(np.int64, copy=False)}
        if self.scale is not None and not self.is_encoded:
            out["features"] = feats * np.float32(self.scale)
        elif not self.is_encoded and feats.dtype != np.float32:  # int64 features: the models take float32
            out["features"] = feats.astype(np.float32)
        if self.decode is None:
            return out
        from evenflow.records.images import ImageDecodeError
        try:
            return self.decode(out)
        except ImageDecodeError as e:  # name the record, not its place in the batch
            from evenflow.records import RecordError
            path, rec, off = self._dataset()._where(int(records[e.position]))
            raise RecordError(path, f"image {self.feature_key!r} {e.reason}; replace it, or leave such records out "
                              f"with --skip-corrupt", record=rec, offset=off, kind="image") from e

    def __repr__(self):
        return (f"RecordSource({self.path!r}, num_samples={self.num_samples}, feature_key={self.feature_key!r}, "
                f"label_key={self.label_key!r})")
