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
  manifest's);
* plain TFRecord files with ``.idx`` sidecars (a glob, a directory of ``*.tfrecord``
  without ``dataset.json``, one ``.tfrecord`` file): keys and labels as on the
  TensorFlow path (:mod:`evenflow.records.plain`).

Encoded images are decoded with Pillow in the loader's workers; the first image fixes
their size. With ``skip_corrupt`` every CRC is checked and every image decoded before
training, and the records that fail are left out of both splits and listed, as on the
TensorFlow path.

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
    notes: tuple[str, ...] = ()  # more lines for the log (e.g. records skipped as corrupt)
    skipped: tuple[dict, ...] = ()  # records left out as corrupt, as JSON objects for summary.json


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
    from evenflow.records.images import DecodeImages, first_image_layout, skip_undecodable, skipped_note
    from evenflow.records.plain import open_for_training
    where = options.dataset
    skip = bool(getattr(options, "skip_corrupt", False))
    ds, plain, keys = open_for_training(where, options.feature_key, options.label_key, skip)
    if plain:  # no manifest: keys from the first record, labels from the sidecars or the records
        feature_key, label_key = keys
    else:
        label_key = ds.label_key or options.label_key
        if ds.labels is None:
            raise ValueError(f"{where}: the records have no label column in their index; convert them with "
                             f"--label-key so the split and the stratified plan can see the labels")
        feature_key = options.feature_key if options.feature_key in ds.specs else None
    feature_key = ds.training_keys(feature_key, label_key)
    if ds.holds_text(feature_key):
        raise ValueError(f"{where}: feature {feature_key!r} holds text; text records train on the TensorFlow path "
                         f"only (evenflow train --framework tf --model text_cnn --dataset {where})")
    skipped = [b.to_json() for b in ds.bad]  # with skip_corrupt: records with a bad CRC, already left out
    good = np.ones(len(ds), bool)
    decode, shape = None, tuple(int(d) for d in ds.specs[feature_key].shape)
    if ds.specs[feature_key].dtype == "bytes":  # encoded images, decoded with Pillow in the loader's workers
        shape = first_image_layout(ds, feature_key, skip)
        decode = DecodeImages(shape)
        if skip:
            good &= skip_undecodable(ds, feature_key, shape, skipped)
    ids = np.flatnonzero(good).astype(np.int64)
    labels = ds.labels[ids]
    k = check_labels(labels, len(ids), where)
    train, test = split_or_explain(labels, options.test_fraction, options.split_seed, where)
    tr = RecordSource(ds, feature_key=feature_key, label_key=label_key, ids=ids[train], decode=decode)
    te = RecordSource(ds, feature_key=tr.feature_key, label_key=label_key, ids=ids[test], decode=decode)
    notes = skipped_note(skipped)
    what = "TFRecord files" if plain else "records"
    return LoadedData(tr, te, k, shape,
                      f"{where}: {what}, {len(train)} train / {len(test)} test samples, {k} classes, "
                      f"feature {tr.feature_key!r} {shape}{' (decoded images)' if decode else ''}",
                      notes=notes, skipped=tuple(skipped))


def load_dataset(options) -> LoadedData:
    """Load ``options.dataset`` (see the module docstring).

    Raises:
        ValueError: unknown builtin, missing file or key, unusable arrays or records; text
            options (``pad_lengths``), which only the TensorFlow path has.
    """
    if getattr(options, "pad_lengths", ""):
        raise ValueError(f"--pad-lengths pads text batches, and text trains on the TensorFlow path only; drop "
                         f"--framework torch (got --pad-lengths {options.pad_lengths})")
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
    from evenflow.records.plain import is_tfrecord_files
    if os.path.isdir(name) or is_tfrecord_files(name):
        return _records(options)
    raise ValueError(f"dataset must be builtin:digits, a path ending in .npz, a records directory written by "
                     f"`evenflow convert`, or TFRecord files with .idx sidecars (a glob, a directory of "
                     f"*.tfrecord, a .tfrecord file); got {name!r}")
