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

The test set is split off per label with ``split_seed`` by
:func:`evenflow.records.arrays.split_indices`, the function the TensorFlow path
uses too, so both frameworks hold out the same samples.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.records.arrays import (check_features, check_labels, digits_arrays, read_npz, split_indices,
                                     split_or_explain)
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


def _from_arrays(x: np.ndarray, y: np.ndarray, options, what: str) -> LoadedData:
    check_features(x, what)
    k = check_labels(y, x.shape[0], what)
    train, test = split_or_explain(y, options.test_fraction, options.split_seed, what)
    x = x.astype(np.float32, copy=False)
    return LoadedData(ArraySource(x[train], y[train]), ArraySource(x[test], y[test]), k,
                      tuple(int(d) for d in x.shape[1:]),
                      f"{what}: {len(train)} train / {len(test)} test samples, {k} classes, features {x.shape[1:]}")


def _digits(options) -> LoadedData:
    return _from_arrays(*digits_arrays("torch"), options, "builtin:digits")


BUILTINS = {"digits": _digits}


def _npz(options) -> LoadedData:
    x, y = read_npz(options.dataset, options.feature_key, options.label_key)
    return _from_arrays(x, y, options, str(Path(options.dataset)))


def _records(options) -> LoadedData:
    from evenflow.records import RecordDataset
    where = options.dataset
    ds = RecordDataset(where)
    label_key = ds.label_key or options.label_key
    if ds.labels is None:
        raise ValueError(f"{where}: the records have no label column in their index; convert them with "
                         f"--label-key so the split and the stratified plan can see the labels")
    k = check_labels(ds.labels, len(ds), where)
    train, test = split_or_explain(ds.labels, options.test_fraction, options.split_seed, where)
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
