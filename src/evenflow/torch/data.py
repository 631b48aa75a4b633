"""Datasets by name for ``evenflow train --framework torch``: builtin digits, ``.npz`` arrays, records.

:func:`load_dataset` takes the same data options as the TensorFlow path
(``dataset``, ``feature_key``, ``label_key``, ``test_fraction``, ``split_seed``; any
object with those attributes) and returns a train and a test
:class:`~evenflow.torch.sources.Source`. It uses numpy and the records layer only,
so every data error surfaces before PyTorch starts.

* ``builtin:<name>``: ``digits`` is scikit-learn's 8x8 digits scaled to [0, 1],
  ``[8, 8, 1]``, exactly as the TensorFlow path loads it;
* a path ending in ``.npz``: arrays named by ``feature_key`` and ``label_key``, no pickle;
* a directory written by ``evenflow convert``: read record by record id through
  :class:`~evenflow.torch.sources.RecordSource` in the loader's workers
  (``feature_key`` defaults to the only non-label feature; the label key is the
  manifest's).

The test set is split off per label with ``split_seed`` by :func:`split_indices`,
the same rule and random stream as ``evenflow.tf.data.split_indices``, so both
frameworks hold out the same samples.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.torch.sources import ArraySource, RecordSource

__all__ = ["LoadedData", "load_dataset", "split_indices"]


@dataclass(frozen=True)
class LoadedData:
    """Train and test sources plus what the model needs to know."""

    train: object
    test: object
    num_classes: int
    feature_shape: tuple[int, ...]
    description: str


def split_indices(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) sorted int64 positions, stratified by label.

    Each label gives ``round(n_c * test_fraction)`` test samples, at least one and at
    most ``n_c - 1`` when it has two or more (a single-sample label stays in training),
    chosen with ``numpy.random.default_rng(seed)`` label by label in sorted order.
    """
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        pos = np.flatnonzero(labels == c)
        k = min(max(int(round(len(pos) * test_fraction)), 1), len(pos) - 1) if len(pos) >= 2 else 0
        test.append(rng.permutation(pos)[:k])
    test = np.sort(np.concatenate(test)).astype(np.int64)
    return np.setdiff1d(np.arange(len(labels), dtype=np.int64), test), test


def _check_labels(y: np.ndarray, n: int, what: str) -> int:
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{what}: labels must have shape [N] = ({n},) to match the features, got {y.shape}")
    if y.dtype.kind not in "iu":
        raise TypeError(f"{what}: labels must be integers 0..K-1, got dtype {y.dtype}; map classes to integers")
    if n and y.min() < 0:
        raise ValueError(f"{what}: labels must be integers 0..K-1, got a label {int(y.min())}")
    k = int(y.max()) + 1 if n else 0
    if k < 2:
        raise ValueError(f"{what}: a classifier needs at least 2 classes, but every label is {k - 1}")
    return k


def _split(labels, options, what: str):
    train, test = split_indices(labels, options.test_fraction, options.split_seed)
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"{what}: {len(labels)} samples are too few to split with test_fraction "
                         f"{options.test_fraction:g}; use more samples or another test_fraction")
    return train, test


def _from_arrays(x: np.ndarray, y: np.ndarray, options, what: str) -> LoadedData:
    if x.ndim < 2:
        raise ValueError(f"{what}: features must have shape [N, ...] with at least one feature axis, got {x.shape}")
    if x.dtype.kind not in "iufb":
        raise TypeError(f"{what}: features must be numeric, got dtype {x.dtype}")
    k = _check_labels(y, x.shape[0], what)
    train, test = _split(y, options, what)
    x = x.astype(np.float32, copy=False)
    return LoadedData(ArraySource(x[train], y[train]), ArraySource(x[test], y[test]), k,
                      tuple(int(d) for d in x.shape[1:]),
                      f"{what}: {len(train)} train / {len(test)} test samples, {k} classes, features {x.shape[1:]}")


def _digits(options) -> LoadedData:
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as e:
        raise ValueError("builtin:digits needs scikit-learn; run pip install 'evenflow[torch]'") from e
    d = load_digits()  # ships with scikit-learn: no download
    x = (d.images / 16.0).astype(np.float32)[..., None]
    return _from_arrays(x, d.target.astype(np.int64), options, "builtin:digits")


BUILTINS = {"digits": _digits}


def _npz(options) -> LoadedData:
    path = Path(options.dataset)
    try:
        with np.load(path, allow_pickle=False) as npz:  # never unpickle a data file
            for key, flag in ((options.feature_key, "feature"), (options.label_key, "label")):
                if key not in npz.files:
                    raise ValueError(f"{path}: has no array {key!r}; its arrays are "
                                     f"{', '.join(npz.files) or 'none'}; pass --{flag}-key NAME")
            x, y = npz[options.feature_key], npz[options.label_key]
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, ValueError) and str(path) in str(e):
            raise
        raise ValueError(f"{path}: cannot read it as a .npz of plain arrays ({e}); save it with numpy.savez "
                         f"without object arrays") from e
    return _from_arrays(x, y, options, str(path))


def _records(options) -> LoadedData:
    from evenflow.records import RecordDataset
    where = options.dataset
    ds = RecordDataset(where)
    label_key = ds.label_key or options.label_key
    if ds.labels is None:
        raise ValueError(f"{where}: the records have no label column in their index; convert them with "
                         f"--label-key so the split and the stratified plan can see the labels")
    k = _check_labels(ds.labels, len(ds), where)
    train, test = _split(ds.labels, options, where)
    feature_key = options.feature_key if options.feature_key in ds.specs else None
    tr = RecordSource(where, feature_key=feature_key, label_key=label_key, ids=train)
    te = RecordSource(where, feature_key=tr.feature_key, label_key=label_key, ids=test)
    return LoadedData(tr, te, k, tr.feature_shape,
                      f"{where}: records, {len(train)} train / {len(test)} test samples, {k} classes, "
                      f"feature {tr.feature_key!r} {tr.feature_shape}")


def load_dataset(options) -> LoadedData:
    """Load ``options.dataset`` (see the module docstring).

    Raises:
        ValueError: unknown builtin, missing file or key, unusable arrays or records.
    """
    name = options.dataset
    if name.startswith("builtin:"):
        key = name.split(":", 1)[1]
        if key not in BUILTINS:
            raise ValueError(f"dataset {name!r} is not a builtin dataset; builtins are "
                             f"{', '.join(f'builtin:{k}' for k in sorted(BUILTINS))}")
        return BUILTINS[key](options)
    if name.endswith(".npz"):
        if not os.path.isfile(name):
            raise ValueError(f"dataset file {name} does not exist; check the path")
        return _npz(options)
    if os.path.isdir(name):
        return _records(options)
    raise ValueError(f"dataset must be builtin:digits, a path ending in .npz, or a records directory written by "
                     f"`evenflow convert`; got {name!r}")
