"""Datasets by name: ``builtin:digits``, ``path.npz`` arrays, records directories, and a hook for more.

:func:`load_dataset` turns :class:`~evenflow.tf.config.DataOptions` into a
:class:`LoadedData`: a train and a test :class:`~evenflow.tf.sources.Source`
plus what the model needs to know (feature shape, number of classes). Loading
uses numpy only, so every data error surfaces before TensorFlow starts.

Kinds of dataset are tried in order:

* ``builtin:<name>`` — a key of :data:`BUILTINS`;
* a path ending in ``.npz`` — arrays named by ``feature_key`` and ``label_key``,
  loaded without pickle;
* a directory written by ``evenflow convert`` (it holds ``dataset.json``) — read by
  record id through :class:`~evenflow.tf.records_source.RecordSource`
  (:mod:`evenflow.tf.records_data`);
* plain TFRecord files with ``.idx`` sidecars (``evenflow index FILES``): a glob such as
  ``'data/train-*.tfrecord'``, a directory of ``*.tfrecord`` files without ``dataset.json``,
  or one ``.tfrecord`` file (:mod:`evenflow.records.plain`);

other kinds plug in with :func:`register_loader`.

The test set is split off with ``split_seed`` (not the training seed), stratified
by label, so it is the same whatever the training seed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from evenflow.records.arrays import (check_features, check_labels, digits_arrays, read_npz, split_indices,
                                     split_or_explain)
from evenflow.tf.sources import ArraySource

__all__ = ["LoadedData", "BUILTINS", "load_dataset", "register_loader", "split_indices"]


@dataclass(frozen=True)
class LoadedData:
    """A dataset ready for training.

    Attributes:
        train: training :class:`~evenflow.tf.sources.Source`.
        test: test source (evaluated exactly once per sample).
        num_classes: K; labels are ``0..K-1``.
        feature_shape: shape of one sample's features, e.g. ``(8, 8, 1)``.
        description: one line for logs and ``summary.json``.
        notes: more lines for the log (e.g. records skipped as corrupt).
        diagnose: optional ``fn(error) -> Exception | None``: after the input pipeline
            failed with ``error`` (a TensorFlow error that names no sample), the
            one-line error to report instead, naming the bad record; None if it
            finds nothing.
        skipped: records left out as corrupt, as JSON objects for ``summary.json``.
    """

    train: object
    test: object
    num_classes: int
    feature_shape: tuple[int, ...]
    description: str
    notes: tuple[str, ...] = ()
    diagnose: Callable | None = None
    skipped: tuple[dict, ...] = ()


def _from_arrays(x: np.ndarray, y: np.ndarray, options, what: str) -> LoadedData:
    check_features(x, what)
    num_classes = check_labels(y, x.shape[0], what)
    train, test = split_or_explain(y, options.test_fraction, options.split_seed, what)
    x = x.astype(np.float32, copy=False)
    return LoadedData(
        train=ArraySource(x[train], y[train]), test=ArraySource(x[test], y[test]), num_classes=num_classes,
        feature_shape=tuple(int(d) for d in x.shape[1:]),
        description=f"{what}: {len(train)} train / {len(test)} test samples, {num_classes} classes, "
                    f"features {tuple(x.shape[1:])}")


def _digits(options) -> LoadedData:
    return _from_arrays(*digits_arrays("tf"), options, "builtin:digits")


def _stdlib_docs(options) -> LoadedData:
    from evenflow.tf.text import load_text  # variable-length text: padded per batch (issue 7)
    return load_text(options, "stdlib-docs")


BUILTINS: dict[str, Callable] = {"digits": _digits, "stdlib-docs": _stdlib_docs}


def _npz(options) -> LoadedData:
    x, y = read_npz(options.dataset, options.feature_key, options.label_key)
    return _from_arrays(x, y, options, str(Path(options.dataset)))


_LOADERS: list[tuple[str, Callable[[str], bool], Callable]] = []


def register_loader(kind: str, matches: Callable[[str], bool], load: Callable) -> None:
    """Teach :func:`load_dataset` a new kind of dataset (e.g. a directory of TFRecords).

    Args:
        kind: a short name for messages, e.g. ``"records"``.
        matches: ``fn(dataset: str) -> bool``; the first registered loader that
            matches wins.
        load: ``fn(options: DataOptions) -> LoadedData``.
    """
    _LOADERS.append((kind, matches, load))


def load_dataset(options) -> LoadedData:
    """Load the dataset named by ``options.dataset``.

    Raises:
        ValueError: unknown builtin name, missing file, unknown array key, a
            directory no registered loader understands, or unusable arrays.
    """
    name = options.dataset
    if name.startswith("builtin:"):
        key = name.split(":", 1)[1]
        if key not in BUILTINS:
            valid = ", ".join(f"builtin:{k}" for k in sorted(BUILTINS))
            raise ValueError(f"dataset {name!r} is not a builtin dataset; builtins are {valid}")
        return BUILTINS[key](options)
    for _kind, matches, load in _LOADERS:
        if matches(name):
            return load(options)
    path = Path(name)
    if name.endswith(".npz"):
        if not path.is_file():
            raise ValueError(f"dataset file {name} does not exist; check the path")
        return _npz(options)
    if path.is_dir():
        raise ValueError(f"dataset {name} is a directory without dataset.json or *.tfrecord files, so not a records "
                         f"dataset; write one with `evenflow convert SRC {name}` (from a .npz file, an image folder "
                         f"or builtin:digits), or pass a .npz file")
    valid = ", ".join(f"builtin:{k}" for k in sorted(BUILTINS))
    raise ValueError(f"dataset must be one of {valid}, a path ending in .npz, or a records directory; "
                     f"got {name!r}")


def _is_records(name: str) -> bool:
    return os.path.isfile(os.path.join(name, "dataset.json")) or (
        os.path.basename(name) == "dataset.json" and os.path.isfile(name))


def _records(options) -> LoadedData:
    from evenflow.tf.records_data import load_records  # numpy and the records layer only
    return load_records(options)


register_loader("records", _is_records, _records)


def _is_tfrecord_files(name: str) -> bool:
    from evenflow.records.plain import is_tfrecord_files  # a glob, a directory of *.tfrecord, a .tfrecord file
    return is_tfrecord_files(name)


register_loader("tfrecord files", _is_tfrecord_files, _records)
