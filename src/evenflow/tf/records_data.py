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
* **Bad records.** Without ``skip_corrupt``, a record that fails while training is
  named afterwards by :meth:`RecordSource.find_bad_record` (``LoadedData.diagnose``).
  With it, every CRC is checked and every image decoded (Pillow) before training;
  records that fail are left out of both splits and listed.
"""
from __future__ import annotations

import io
import os

import numpy as np

from evenflow.tf.data import LoadedData, split_indices

__all__ = ["CACHE_BYTES", "load_records"]

# Datasets up to this many bytes of shards are cached in memory as one tf.string tensor.
CACHE_BYTES = 1 << 30
# Defaults of DataOptions.feature_key / label_key: for records they mean "the manifest's".
_DEFAULT_FEATURE, _DEFAULT_LABEL = "x", "y"
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


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


def _image_layout(ds, key: str, record: int) -> tuple[int, int, int]:
    """(height, width, channels) of the encoded image of ``record``, from its header (Pillow)."""
    from evenflow.records import RecordError
    try:
        from PIL import Image
    except ModuleNotFoundError as e:  # pragma: no cover - matplotlib, in the tf extra, brings Pillow
        raise ModuleNotFoundError("training on encoded images needs Pillow to read their size; "
                                  "pip install pillow", name=e.name) from e
    data = ds.decode_batch([record], keys=[key])[key][0]
    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            w, h = im.size
            mode = im.mode
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError...
        path, rec, off = ds._where(record)
        raise RecordError(path, f"image {key!r} does not decode: {type(e).__name__}: {e}; replace it, or leave "
                          f"such records out with --skip-corrupt", record=rec, offset=off, kind="image") from e
    return h, w, 1 if mode in _GREY_MODES else 3


def _undecodable_images(ds, key: str, layout: tuple[int, int, int]) -> np.ndarray:
    """bool ``[N]``: records whose image Pillow cannot fully decode. Another size is an error."""
    from PIL import Image

    from evenflow.records import RecordError

    bad = np.zeros(len(ds), bool)
    for lo in range(0, len(ds), 1024):
        ids = np.arange(lo, min(lo + 1024, len(ds)))
        for i, data in zip(ids.tolist(), ds.decode_batch(ids, keys=[key])[key]):
            try:
                with Image.open(io.BytesIO(bytes(data))) as im:
                    im.load()
                    w, h = im.size
            except Exception:
                bad[i] = True
                continue
            if (h, w) != layout[:2]:
                path, rec, off = ds._where(i)
                raise RecordError(path, f"image {key!r} is {h}x{w} but the dataset's first image is "
                                  f"{layout[0]}x{layout[1]}; every image must have the same size: resize them "
                                  f"before converting", record=rec, offset=off, kind="image")
    return bad


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
    from evenflow.records import RecordDataset, RecordError
    from evenflow.tf.records_source import RecordSource, decode_images
    from evenflow.tf.sources import SubsetSource

    path = options.dataset
    skip = bool(getattr(options, "skip_corrupt", False))
    ds = RecordDataset(path, skip_corrupt=skip)
    where = ds.manifest_path or path
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no records; nothing to train on")
    feature_key, label_key = _keys(ds, options, where)
    probe = RecordSource(ds, feature_key=feature_key, label_key=label_key)  # checks and picks the keys
    feature_key, spec = probe.feature_key, probe.feature_spec
    skipped = [b.to_json() for b in ds.bad]
    good = np.ones(len(ds), bool)
    if probe.is_encoded:
        layout = None
        for i in range(len(ds)):  # the first image fixes the layout; with skip_corrupt, the first that opens
            try:
                layout = _image_layout(ds, feature_key, i)
                break
            except RecordError:
                if not skip:
                    raise
        if layout is None:
            raise RecordError(where, f"no image {feature_key!r} in the records opens; nothing to train on",
                              kind="image")
        if skip:
            bad_images = _undecodable_images(ds, feature_key, layout)
            for i in np.flatnonzero(bad_images).tolist():
                p, rec, off = ds._where(i)
                skipped.append({"path": p, "record": rec, "offset": off, "kind": "image",
                                "reason": f"image {feature_key!r} does not decode (Pillow)"})
            good &= ~bad_images
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

    notes = ()
    if skipped:
        listed = "; ".join(f"{b['path']} (record {b['record']}, offset {b['offset']}): {b['kind']}"
                           for b in skipped[:5])
        more = f"; and {len(skipped) - 5} more (summary.json lists them)" if len(skipped) > 5 else ""
        notes = (f"skipped {len(skipped)} bad records: {listed}{more}",)
    reading = "cached in memory" if cache else "read by offset"
    return LoadedData(
        train=SubsetSource(source, ids[train]), test=SubsetSource(source, ids[test]), num_classes=num_classes,
        feature_shape=tuple(int(d) for d in shape),
        description=f"{path}: records ({len(ds)} in {len(ds.paths)} shards, {size / 1e6:.1f} MB, {reading}), "
                    f"{len(train)} train / {len(test)} test samples, {num_classes} classes, feature "
                    f"{feature_key!r} {tuple(shape)}{' (decoded images)' if probe.is_encoded else ''}",
        notes=notes, diagnose=diagnose, skipped=tuple(skipped))


def _as_float32(batch: dict) -> dict:
    from evenflow.tf._lazy import tf
    return {**batch, "features": tf().cast(batch["features"], tf().float32)}
