"""Any numpy :class:`evenflow.data.Source` in a ``tf.data`` pipeline: its ``batch`` in ``tf.numpy_function``.

The general path of :func:`evenflow.tf.input.source_adapter.tf_source`, for sources that have no
TensorFlow twin (yours, say). TensorFlow must know what a ``numpy_function`` returns before
it runs, so :class:`NumpySource` asks the source for two small batches when it is made
(ids ``[0]`` and ``[N - 1]``) and fixes the keys, the dtypes and the per-sample shapes from
them: an axis that differs between the two is variable (``None``), and so is every axis the
source's ``feature_shape`` (if it has one) gives as None. Every later batch must have
those keys and dtypes. The call goes through :func:`evenflow.tf.input.pyfunc.numpy_function`,
so a pipeline that is still running when the process ends cannot hang it.
"""
from __future__ import annotations

import numpy as np

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import numpy_function
from evenflow.util.read_errors import note_samples


def _column(key: str, value) -> np.ndarray:
    """``value`` as an array with one row per id; text as bytes."""
    arr = np.asarray(value)
    if arr.dtype.kind == "U":
        arr = np.char.encode(arr, "utf-8")
    if arr.dtype.kind not in "biufSO":
        raise TypeError(f"source.batch returned {key!r} of dtype {arr.dtype}; return numbers, booleans or bytes")
    return arr


def _spec(key: str, arrays: list[np.ndarray]) -> tuple:
    """``(numpy dtype or None for bytes, per-sample shape)`` of one key, from its probe batches."""
    shapes = {a.shape[1:] for a in arrays}
    if len({len(s) for s in shapes}) != 1:
        raise ValueError(f"source.batch returned {key!r} with a different number of axes for different ids "
                         f"({sorted(shapes)}); every sample of a key must have the same rank")
    dims = tuple(d if len({s[i] for s in shapes}) == 1 else None for i, d in enumerate(arrays[0].shape[1:]))
    kinds = {a.dtype.kind in "SO" for a in arrays}
    dtypes = {a.dtype for a in arrays if a.dtype.kind not in "SO"}
    if len(kinds) != 1 or len(dtypes) > 1:
        raise ValueError(f"source.batch returned {key!r} as {' and '.join(sorted(str(a.dtype) for a in arrays))} "
                         f"for different ids; a key must have one dtype")
    return (None if kinds == {True} else dtypes.pop()), dims


class NumpySource:
    """A TensorFlow source that runs a numpy source's ``batch`` in ``tf.numpy_function``.

    Args:
        source: an :class:`evenflow.data.Source` whose ``batch`` returns numpy arrays
            (numbers, booleans or bytes) with one row per id.

    Raises:
        TypeError, ValueError: a probe batch that is not a dict of such arrays, or whose
            keys, dtypes or ranks differ between ids.
    """

    def __init__(self, source):
        self.source = source
        self.num_samples = int(source.num_samples)
        probes = [np.array([0], np.int64), np.array([self.num_samples - 1], np.int64)]
        batches = [self._batch(ids) for ids in probes]
        if set(batches[0]) != set(batches[1]):
            raise ValueError(f"source.batch returned the keys {sorted(batches[0])} for id 0 and {sorted(batches[1])} "
                             f"for id {self.num_samples - 1}; every batch must have the same keys")
        self.keys = tuple(sorted(batches[0]))
        self.specs = {k: _spec(k, [b[k] for b in batches]) for k in self.keys}
        declared = getattr(source, "feature_shape", None)
        if "features" in self.specs and declared is not None and len(declared) == len(self.specs["features"][1]):
            fixed = self.specs["features"][1]
            self.specs["features"] = (self.specs["features"][0],
                                      tuple(None if d is None else f for d, f in zip(declared, fixed)))

    def _batch(self, ids: np.ndarray) -> dict:
        try:
            batch = self.source.batch(ids)
        except Exception as e:  # the source's own error, with the samples it was asked for
            note_samples(e, f"{type(self.source).__name__}.batch", ids)
            raise
        if not isinstance(batch, dict):
            raise TypeError(f"source.batch must return a dict of arrays, got {type(batch).__name__}")
        out = {}
        for key, value in batch.items():
            arr = _column(key, value)
            if arr.ndim < 1 or arr.shape[0] != ids.shape[0]:
                raise ValueError(f"source.batch must return one row per id: {ids.shape[0]} ids, but {key!r} has "
                                 f"shape {arr.shape}")
            out[key] = arr
        return out

    def _call(self, ids: np.ndarray) -> list:
        batch = self._batch(np.asarray(ids, np.int64))
        if set(batch) != set(self.keys):
            raise ValueError(f"source.batch returned the keys {sorted(batch)}, but its first batches had "
                             f"{list(self.keys)}; every batch must have the same keys")
        out = []
        for key in self.keys:
            dtype = self.specs[key][0]
            value = batch[key]
            out.append(value.astype(object) if dtype is None else value.astype(dtype, copy=False))
        return out

    def index(self):
        return self.source.index()

    def batch(self, ids) -> dict:
        tf = _tf()
        tout = [tf.string if self.specs[k][0] is None else tf.as_dtype(self.specs[k][0]) for k in self.keys]
        values = numpy_function(self._call, [ids], tout, stateful=False)
        return {k: tf.ensure_shape(v, [None, *self.specs[k][1]]) for k, v in zip(self.keys, values)}

    def __repr__(self):
        return f"NumpySource({self.source!r})"
