"""Datasets by name, as numpy sources: builtins, ``.npz`` arrays, records, plain TFRecord files, and more.

:func:`load_dataset` turns data options into a :class:`~evenflow.data.loaded.LoadedData`: a
train and a test :class:`~evenflow.data.source.Source` plus what the model needs to know
(feature shape, number of classes). It uses numpy, Pillow and the records layer only, so
every data error surfaces before a framework starts, and every framework trains on the
same samples and holds out the same ones.

Kinds of dataset are tried in order:

* ``builtin:<name>`` — a key of :data:`BUILTINS`: ``digits`` (scikit-learn's 8x8 digits
  scaled to [0, 1], ``[8, 8, 1]``) and ``stdlib-docs`` (token sequences,
  :mod:`evenflow.data.stdlib_docs`);
* other kinds registered with :func:`register_loader`, first match first: by default a
  directory written by ``evenflow convert`` (it holds ``dataset.json``) and plain TFRecord
  files with ``.idx`` sidecars (``evenflow index FILES``): a glob such as
  ``'data/train-*.tfrecord'``, a directory of ``*.tfrecord`` files without ``dataset.json``,
  or one ``.tfrecord`` file — both read by :mod:`evenflow.data.load_records`;
* a path ending in ``.npz`` — arrays named by ``feature_key`` and ``label_key``, loaded
  without pickle.

The test set is split off with ``split_seed`` (not the training seed), stratified by label
(:func:`~evenflow.data.arrays.split_indices`), so it is the same whatever the training seed.
With ``test_fraction`` 0 nothing is held out (``LoadedData.test`` is None), unless
``eval_dataset`` names a dataset of any of the kinds above: it is then loaded whole as the
test source (:mod:`evenflow.data.evaluation` checks that it fits the training data).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from evenflow.data.identity import data_identity, digest
from evenflow.data.arrays import (check_features, check_labels, digits_arrays, read_npz, split_facts, split_indices,
                                  split_or_explain, split_text)
from evenflow.data.evaluation import eval_options, with_evaluation
from evenflow.data.load_records import load_records
from evenflow.data.loaded import LoadedData
from evenflow.data.plain import is_tfrecord_files
from evenflow.records.remote.url import is_url
from evenflow.data.source import ArraySource
from evenflow.data.stdlib_docs import BUILTIN_TEXT
from evenflow.data.pad_lengths import pad_lengths_of
from evenflow.data.text import VOCAB_SIZE, TextSource
from evenflow.records.manifest import MANIFEST_NAME


def _from_arrays(x: np.ndarray, y: np.ndarray, options, what: str, keys=(None, None)) -> LoadedData:
    check_features(x, what)
    num_classes = check_labels(y, x.shape[0], what)
    train, test = split_or_explain(y, options.test_fraction, options.split_seed, what)
    x = x.astype(np.float32, copy=False)
    split = split_facts(train, test, options.test_fraction, options.split_seed)
    return LoadedData(
        train=ArraySource(x[train], y[train]), test=ArraySource(x[test], y[test]) if len(test) else None,
        num_classes=num_classes, feature_shape=tuple(int(d) for d in x.shape[1:]),
        description=f"{what}: {split_text(len(train), len(test))}, {num_classes} classes, "
                    f"features {tuple(x.shape[1:])}",
        split=split, identity=data_identity(digest(x, y), x.shape[1:], split), keys=keys, dataset_ids=train)


def _digits(options) -> LoadedData:
    return _from_arrays(*digits_arrays(), options, "builtin:digits")


def _text(name: str) -> Callable:
    def load(options) -> LoadedData:
        data = BUILTIN_TEXT[name]()
        train, test = split_indices(data.labels, options.test_fraction, options.split_seed)
        lengths, pad_lengths = data.lengths, pad_lengths_of(options)
        split = split_facts(train, test, options.test_fraction, options.split_seed)
        content = digest(data.tokens, data.offsets, data.labels)
        return LoadedData(
            train=TextSource(data.subset(train), pad_lengths),
            test=TextSource(data.subset(test), pad_lengths) if len(test) else None,
            num_classes=len(data.class_names), feature_shape=(None,), kind="text", vocab_size=VOCAB_SIZE,
            split=split, identity=data_identity(content, (None,), split, (pad_lengths,)), dataset_ids=train,
            class_names=tuple(data.class_names),
            description=f"{data.name}: {split_text(len(train), len(test), 'sequences')}, "
                        f"{len(data.class_names)} classes, {int(lengths.min())}-{int(lengths.max())} tokens "
                        f"(mean {lengths.mean():.0f})")

    return load


BUILTINS: dict[str, Callable] = {"digits": _digits, "stdlib-docs": _text("stdlib-docs")}


def _npz(options) -> LoadedData:
    if options.skip_corrupt:
        raise ValueError(f"--skip-corrupt checks the records of a records dataset, and {options.dataset} is a .npz "
                         f"file; drop --skip-corrupt")
    x, y = read_npz(options.dataset, options.feature_key, options.label_key)
    return _from_arrays(x, y, options, str(Path(options.dataset)), (options.feature_key, options.label_key))


_LOADERS: list[tuple[str, Callable[[str], bool], Callable]] = []


def register_loader(kind: str, matches: Callable[[str], bool], load: Callable) -> None:
    """Teach :func:`load_dataset` a new kind of dataset.

    Args:
        kind: a short name for messages, e.g. ``"records"``.
        matches: ``fn(dataset: str) -> bool``; the first registered loader that
            matches wins.
        load: ``fn(options) -> LoadedData``.
    """
    _LOADERS.append((kind, matches, load))


def _valid_builtins() -> str:
    return ", ".join(f"builtin:{k}" for k in sorted(BUILTINS))


def load_dataset(options) -> LoadedData:
    """Load the dataset named by ``options.dataset``, and the evaluation dataset if one is named.

    Args:
        options: any object with ``dataset``, ``feature_key``, ``label_key``,
            ``test_fraction``, ``split_seed``, ``skip_corrupt`` and ``pad_lengths``; and
            optionally ``eval_dataset`` (a dataset of any kind to evaluate on, whole, instead
            of a held-out split; see :mod:`evenflow.data.evaluation`).

    Raises:
        ValueError: unknown builtin name, missing file, unknown array key, a
            directory no registered loader understands, or unusable arrays or records
            (:class:`~evenflow.records.RecordError` for records, naming the file); an
            evaluation dataset that does not load or does not fit the training data,
            naming ``--eval-dataset``.
    """
    data = _load_one(options)
    name = getattr(options, "eval_dataset", "")
    if not name:
        return data
    records = any(matches(name) for _kind, matches, _load in _LOADERS)
    return with_evaluation(data, lambda: _load_one(eval_options(options, records)), options)


def _load_one(options) -> LoadedData:
    name = options.dataset
    if name.startswith("builtin:"):
        key = name.split(":", 1)[1]
        if key not in BUILTINS:
            raise ValueError(f"dataset {name!r} is not a builtin dataset; builtins are {_valid_builtins()}")
        for flag, value in (("feature_key", options.feature_key), ("label_key", options.label_key)):
            if value != {"feature_key": "x", "label_key": "y"}[flag]:
                raise ValueError(f"--{flag.replace('_', '-')} {value} names an array of a .npz file or a feature of "
                                 f"records, and {name} has neither; drop --{flag.replace('_', '-')}")
        if options.skip_corrupt:
            raise ValueError(f"--skip-corrupt checks the records of a records dataset, and {name} is a builtin one; "
                             f"drop --skip-corrupt")
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
    raise ValueError(f"dataset must be one of {_valid_builtins()}, a path ending in .npz, a records directory "
                     f"written by `evenflow convert`, or TFRecord files with .idx sidecars (a glob, a directory of "
                     f"*.tfrecord, a .tfrecord file); got {name!r}")


def _is_records(name: str) -> bool:
    if is_url(name):  # object storage: a records folder or TFRecord objects, told apart when opened
        return True
    return os.path.isfile(os.path.join(name, MANIFEST_NAME)) or (
        os.path.basename(name) == MANIFEST_NAME and os.path.isfile(name))


register_loader("records", _is_records, load_records)
register_loader("tfrecord files", is_tfrecord_files, load_records)
