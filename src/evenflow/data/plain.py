"""Plain TFRecord files as a training dataset: no ``dataset.json``, only ``.idx`` sidecars.

Files written by ``tf.io.TFRecordWriter`` (or any other tool) become a dataset once
``evenflow index FILES`` has written their sidecars. :func:`tfrecord_files` says which
``--dataset`` values name such files, and in which order their records are numbered:

* a glob pattern (it holds ``*``, ``?`` or ``[``): the matching files, sorted by name,
  minus sidecars (``.idx``, ``.meta.npz``); no match is an error;
* a directory without ``dataset.json``: its ``*.tfrecord`` and ``*.tfrecords`` files,
  sorted by name;
* one existing file whose name ends in ``.tfrecord`` or ``.tfrecords``;
* an object-store URL (``s3://bucket/train-*.tfrecord``, ``gs://…``) of any of these kinds; a folder URL
  that holds a ``dataset.json`` is a records directory.

Sample ids are the records in that order, file after file. Without a manifest there is no
label column unless ``evenflow index --label-key`` stored one; :func:`label_column` then
reads the label feature from the records themselves (vectorised, in chunks), so the
split and the stratified plan see the labels either way.
"""
from __future__ import annotations

import glob
import os

import numpy as np

from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import RecordError
from evenflow.records.manifest import MANIFEST_NAME
from evenflow.records.remote.url import is_url

SUFFIXES = (".tfrecord", ".tfrecords")
_SIDECARS = (".idx", ".meta.npz")
_GLOB_CHARS = "*?["
_CHUNK = 4096  # records decoded per batch when reading a label column


def is_tfrecord_files(name: str) -> bool:
    """Whether ``name`` is meant as plain TFRecord files (see the module docstring); no file is read.

    A path that exists is taken as it is, even when it holds glob characters (``data[1]/``). A folder
    URL is asked whether it holds a ``dataset.json``.
    """
    if is_url(name):
        from evenflow.records.remote.listing import has_glob, manifest_url
        from evenflow.records.remote.options import StoreOptions
        return has_glob(name) or name.endswith(SUFFIXES) or manifest_url(name, StoreOptions.from_env()) is None
    if any(c in name for c in _GLOB_CHARS) and not os.path.exists(name):
        return True
    if os.path.isdir(name):
        return not os.path.exists(os.path.join(name, MANIFEST_NAME)) and any(
            f.endswith(SUFFIXES) for f in os.listdir(name))
    return name.endswith(SUFFIXES)


def tfrecord_files(name: str) -> list[str]:
    """The TFRecord files ``name`` stands for, sorted by name.

    Raises:
        RecordError: a pattern that matches no TFRecord file, or a file that does not exist.
    """
    if is_url(name):
        from evenflow.records.remote.listing import expand
        from evenflow.records.remote.options import StoreOptions
        return expand(name, StoreOptions.from_env())
    if any(c in name for c in _GLOB_CHARS) and not os.path.exists(name):
        files = sorted(f for f in glob.glob(name) if os.path.isfile(f) and not f.endswith(_SIDECARS))
        if not files:
            raise RecordError(name, "the pattern matches no TFRecord file; check the path (quote the pattern "
                              "so that the shell does not expand it)", kind="input")
        return files
    if os.path.isdir(name):
        return sorted(os.path.join(name, f) for f in os.listdir(name) if f.endswith(SUFFIXES))
    if not os.path.isfile(name):
        raise RecordError(name, "no such TFRecord file; check the path", kind="input")
    return [name]


def plain_keys(ds, feature_key: str, label_key: str, default_feature: str = "x",
               default_label: str = "y") -> tuple[str, str]:
    """``(feature key, label key)`` of plain records, checked against their first record.

    The defaults of ``--feature-key`` / ``--label-key`` (``x`` / ``y``) fall back to a
    feature named ``label`` for the label and to the only other feature for the features.

    Raises:
        RecordError: a key the records do not hold, naming the first file and the keys it holds.
    """
    specs, where = ds.specs, ds.paths[0]
    held = ", ".join(sorted(specs)) or "no features"
    if label_key not in specs and label_key == default_label and "label" in specs:
        label_key = "label"
    if label_key not in specs:
        raise RecordError(where, f"label key {label_key!r} is not in the records; they hold {held}; pass "
                          f"--label-key with one of them", kind="feature")
    if feature_key not in specs and feature_key == default_feature:
        others = [k for k in specs if k != label_key]
        if len(others) != 1:
            raise RecordError(where, f"cannot choose the feature key: the records hold {held}; pass --feature-key "
                              f"with one of {', '.join(sorted(others))}", kind="feature")
        feature_key = others[0]
    if feature_key not in specs or feature_key == label_key:
        raise RecordError(where, f"feature key {feature_key!r} is not in the records (or is the label); they hold "
                          f"{held}; pass --feature-key with another one", kind="feature")
    return feature_key, label_key


def label_column(ds, key: str) -> np.ndarray:
    """int64 ``[N]``: the label of every record, from the sidecars or else decoded from the records.

    Args:
        ds: an open :class:`~evenflow.records.RecordDataset`.
        key: the label feature, one int64 per record.

    Raises:
        RecordError: the feature is not one int64 per record.
    """
    if ds.labels is not None:
        return np.asarray(ds.labels, np.int64)
    spec = ds.specs[key]
    if spec.dtype != "int64" or spec.size != 1:
        raise RecordError(ds.paths[0], f"label key {key!r} must be one int64 per record, it is {spec.dtype} with "
                          f"shape {spec.shape}; pass --label-key with an int64 feature", kind="feature")
    parts = [ds.decode_batch(np.arange(lo, min(lo + _CHUNK, len(ds))), keys=[key])[key].reshape(-1)
             for lo in range(0, len(ds), _CHUNK)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def open_for_training(name: str, feature_key: str, label_key: str, skip_corrupt: bool = False):
    """Open ``--dataset NAME`` (a records directory or plain TFRecord files) for a training run.

    Returns:
        ``(dataset, plain, keys)``: the :class:`~evenflow.records.RecordDataset`, whether it
        is plain TFRecord files, and for those the ``(feature_key, label_key)`` taken from
        the first record, with the label column read from the records when no sidecar
        holds it (None for a directory written by ``evenflow convert``: its manifest names
        the keys).

    Raises:
        RecordError, ValueError: see :func:`tfrecord_files`, :func:`plain_keys`; no records.
    """
    plain = is_tfrecord_files(name)
    ds = RecordDataset(tfrecord_files(name) if plain else name, skip_corrupt=skip_corrupt)
    if len(ds) == 0:
        raise ValueError(f"{ds.manifest_path or name}: the dataset has no records; nothing to train on")
    keys = None
    if plain:
        keys = plain_keys(ds, feature_key, label_key)
        ds.set_labels(label_column(ds, keys[1]))
    return ds, plain, keys
