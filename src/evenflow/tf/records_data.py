"""Training data from a records directory: what ``evenflow train --dataset DIR`` loads.

A directory written by ``evenflow convert`` (shards, ``.idx`` sidecars, ``dataset.json``)
becomes a train and a test :class:`~evenflow.tf.sources.SubsetSource` over one
:class:`~evenflow.tf.records_source.RecordSource`, so training reads whichever records
the plan sends to a replica, by offset. Only numpy, Pillow (for an image's size) and
the records layer run here: every check happens before TensorFlow starts.

* **Keys.** The label is the manifest's label key: its column in the sidecar index
  drives the split and the stratified plan. The feature is ``feature_key`` when the
  records hold it; the default ``"x"`` falls back to the manifest's image, or to its
  only other feature. A key the records do not hold is an error naming
  ``dataset.json`` and the keys it lists.
* **Plain TFRecord files** (a glob, a directory of ``*.tfrecord`` files without
  ``dataset.json``, or one ``.tfrecord`` file; :mod:`evenflow.records.plain`) need only
  their ``.idx`` sidecars (``evenflow index FILES``). The first record gives the keys:
  ``label_key`` (default ``y``, else a feature named ``label``) and ``feature_key``
  (default ``x``, else the only other feature). Labels come from the sidecars when
  ``evenflow index --label-key`` stored them, else they are read from the records
  (decoded in chunks), so the split and the plan are stratified either way.
* **Split.** :func:`evenflow.tf.data.split_indices` on the sidecar labels with
  ``test_fraction`` and ``split_seed``: the rule and random stream of ``.npz`` files
  and ``builtin:digits``, so records converted from ``builtin:digits`` hold out the
  same 359 samples. The manifest has no split of its own; to train on a fixed test
  set, convert it into a directory of its own and evaluate it separately.
* **Reading.** Datasets of at most :data:`CACHE_BYTES` are held in memory
  (``cache=True``: one ``tf.gather`` per batch, nothing in Python); larger ones are
  read by offset for every batch. CRCs are checked either way (the cache once).
* **Images.** Encoded images are decoded in the pipeline to float32 in [0, 1]; the
  first record fixes height, width and channels (grey for grey modes, else RGB), and
  an image of another size stops training with an error naming it.
* **Text.** A ``bytes`` feature that the manifest does not name as its image (``evenflow
  convert builtin:stdlib-docs``) is variable-length text: :mod:`evenflow.tf.records_text`
  turns each batch into padded token ids like the builtin (feature shape ``(None,)``).
* **Bad records.** Without ``skip_corrupt``, a record that fails while training is
  named afterwards by :meth:`RecordSource.find_bad_record` (``LoadedData.diagnose``).
  With it, every CRC is checked and every image decoded (Pillow) before training;
  records that fail are left out of both splits and listed.
"""
from __future__ import annotations

import os

import numpy as np

from evenflow.tf.data import LoadedData, split_indices

__all__ = ["CACHE_BYTES", "load_records"]

# Datasets up to this many bytes of shards are cached in memory as one tf.string tensor.
CACHE_BYTES = 1 << 30
# Defaults of DataOptions.feature_key / label_key: for records they mean "the manifest's".
_DEFAULT_FEATURE, _DEFAULT_LABEL = "x", "y"


def _keys(ds, options, where: str) -> tuple[str | None, str]:
    """(feature key or None for "choose", label key), checked against the records."""
    from evenflow.records import RecordError

    specs = ds.specs
    label = ds.label_key
    if label is None:
        raise RecordError(where, "the records have no label column (dataset.json has no label_key); convert them "
                          "with --label-key so the split and the stratified plan can see the labels", kind="input")
    if options.label_key not in (_DEFAULT_LABEL, label):
        held = "is not in the records" if options.label_key not in specs else "is not their label column"
        raise RecordError(where, f"label_key {options.label_key!r} {held}; the index holds the labels of {label!r} "
                          f"(convert again with --label-key {options.label_key} to use another one)",
                          kind="feature")
    if options.feature_key in specs and options.feature_key != label:
        return options.feature_key, label
    if options.feature_key != _DEFAULT_FEATURE:
        raise RecordError(where, f"feature key {options.feature_key!r} is not in the records; they hold "
                          f"{', '.join(sorted(specs)) or 'no features'}", kind="feature")
    return None, label


def load_records(options) -> LoadedData:
    """Load the records directory ``options.dataset`` (see the module docstring).

    Args:
        options: :class:`~evenflow.tf.config.DataOptions` (``dataset``, ``feature_key``,
            ``label_key``, ``test_fraction``, ``split_seed``, ``skip_corrupt``).

    Raises:
        RecordError: a missing or stale index, a key the records do not hold, an
            image that does not decode; one line naming the file (and record).
        ValueError: too few samples to split, fewer than 2 classes.
    """
    from evenflow.records.images import first_image_layout, skip_undecodable, skipped_note
    from evenflow.records.plain import open_for_training
    from evenflow.tf.records_source import RecordSource, decode_images
    from evenflow.tf.records_text import is_text, text_layout
    from evenflow.tf.sources import SubsetSource

    path = options.dataset
    skip = bool(getattr(options, "skip_corrupt", False))
    ds, plain, keys = open_for_training(path, options.feature_key, options.label_key, skip)
    where = ds.manifest_path or path
    if plain:  # no manifest: keys from the first record, labels from the sidecars or the records
        feature_key, label_key = keys
    else:
        feature_key, label_key = _keys(ds, options, where)
    probe = RecordSource(ds, feature_key=feature_key, label_key=label_key)  # checks and picks the keys
    feature_key, spec = probe.feature_key, probe.feature_spec
    skipped = [b.to_json() for b in ds.bad]
    good = np.ones(len(ds), bool)
    text = None
    if is_text(ds, feature_key):  # variable-length text, e.g. `evenflow convert builtin:stdlib-docs`
        text = text_layout(ds, feature_key, options)
        decode, shape = text.decode, (None,)
    elif probe.is_encoded:
        layout = first_image_layout(ds, feature_key, skip)  # with skip_corrupt, of the first image that opens
        if skip:
            good &= skip_undecodable(ds, feature_key, layout, skipped)
        decode = decode_images(channels=layout[2], shape=layout[:2])
        shape = layout
    else:
        if len(spec.shape) < 1:
            raise ValueError(f"{where}: feature {feature_key!r} is one number per record; a classifier needs at "
                             f"least one feature axis, pick another --feature-key")
        decode = _as_float32 if spec.dtype != "float32" else None
        shape = tuple(int(d) for d in spec.shape)
    size = sum(os.path.getsize(p) for p in ds.paths)
    cache = size <= CACHE_BYTES
    source = RecordSource(ds, feature_key=feature_key, label_key=label_key, cache=cache, decode=decode, verify=True)
    source.preload()  # cached: every CRC is checked now, before TensorFlow starts and anything is written

    ids = np.flatnonzero(good).astype(np.int64)
    labels = ds.labels[ids]
    if labels.min() < 0:
        raise ValueError(f"{where}: labels must be integers 0..K-1, but the index holds a label {int(labels.min())}")
    names = ds.class_names or []
    num_classes = max(int(labels.max()) + 1, len(names))
    if num_classes < 2:
        raise ValueError(f"{where}: a classifier needs at least 2 classes, but every label is {int(labels.max())}")
    train, test = split_indices(labels, options.test_fraction, options.split_seed)
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"{where}: {len(ids)} samples are too few to split with test_fraction "
                         f"{options.test_fraction:g}; use more samples or another test_fraction")

    def diagnose(error):
        return source.find_bad_record(ids)

    notes = skipped_note(skipped)
    reading = "cached in memory" if cache else "read by offset"
    kind = f" ({text.describe()})" if text else " (decoded images)" if probe.is_encoded else ""
    return LoadedData(
        train=SubsetSource(source, ids[train]), test=SubsetSource(source, ids[test]), num_classes=num_classes,
        feature_shape=tuple(shape),
        description=f"{path}: {'TFRecord files' if plain else 'records'} ({len(ds)} in {len(ds.paths)} shards, "
                    f"{size / 1e6:.1f} MB, {reading}), "
                    f"{len(train)} train / {len(test)} test samples, {num_classes} classes, feature "
                    f"{feature_key!r} {tuple(shape)}{kind}",
        notes=notes, diagnose=diagnose, skipped=tuple(skipped))


def _as_float32(batch: dict) -> dict:
    from evenflow.tf._lazy import tf
    return {**batch, "features": tf().cast(batch["features"], tf().float32)}
