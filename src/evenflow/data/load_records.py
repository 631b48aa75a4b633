"""Training data from records: what ``--dataset DIR`` (or TFRecord files) loads, in numpy.

A directory written by ``evenflow convert`` (shards, ``.idx`` sidecars, ``dataset.json``), or
plain TFRecord files with ``.idx`` sidecars, becomes a train and a test
:class:`~evenflow.data.source.SubsetSource` over one :class:`~evenflow.data.records_source.RecordSource`,
so training reads whichever records the plan sends to a replica, by offset. Only numpy,
Pillow (for an image's size) and the records layer run here: every check happens before
a framework starts.

* **Keys.** The label is the manifest's label key: its column in the sidecar index
  drives the split and the stratified plan. The feature is ``feature_key`` when the
  records hold it; the default ``"x"`` falls back to the manifest's image, or to its
  only other feature. A key the records do not hold is an error naming
  ``dataset.json`` and the keys it lists.
* **Plain TFRecord files** (a glob, a directory of ``*.tfrecord`` files without
  ``dataset.json``, or one ``.tfrecord`` file; :mod:`evenflow.data.plain`) need only
  their ``.idx`` sidecars (``evenflow index FILES``). The first record gives the keys:
  ``label_key`` (default ``y``, else a feature named ``label``) and ``feature_key``
  (default ``x``, else the only other feature). Labels come from the sidecars when
  ``evenflow index --label-key`` stored them, else they are read from the records
  (decoded in chunks), so the split and the plan are stratified either way.
* **Split.** :func:`~evenflow.data.arrays.split_indices` on the sidecar labels with
  ``test_fraction`` and ``split_seed``: the rule and random stream of ``.npz`` files
  and ``builtin:digits``, so records converted from ``builtin:digits`` hold out the
  same 359 samples; ``test_fraction`` 0 holds nothing out. The manifest has no split
  of its own; to evaluate on a fixed test set, convert it into a directory of its own
  and name it with ``eval_dataset`` (:mod:`evenflow.data.evaluation`).
* **Reading.** Datasets of at most :data:`CACHE_BYTES` are held in memory (``cache``:
  decoded once, here, before any framework starts); larger ones are read by offset for
  every batch. CRCs are checked either way (the cache once, here).
* **Images.** Encoded images are decoded to float32 in [0, 1]
  (:class:`~evenflow.data.images.DecodeImages`); the first record fixes height, width and
  channels (grey for grey modes, else RGB), and an image of another size stops training
  with an error naming it.
* **Text.** A ``bytes`` feature that the manifest does not name as its image (``evenflow
  convert builtin:stdlib-docs``) is variable-length text: each batch becomes token ids
  padded per batch (:class:`~evenflow.data.text.DecodeText`), like the builtin (feature
  shape ``(None,)``).
* **Variable-length lists.** A float32/int64 feature whose length differs between records
  (token ids written with ``tf.io.TFRecordWriter``; in plain files every record is read
  once to find out: :func:`~evenflow.data.sequences.settle_lists`) is padded per batch like
  text (:class:`~evenflow.data.sequences.PadSequences`, feature shape ``(None,)``); its
  lengths are the costs unless the sidecars hold a cost column. int64 ids are read as
  ``id + 1`` (0 = padding) with the vocabulary largest id + 2; a negative id is refused.
* **Trust.** Every shard's sidecars are checked against the records before anything else:
  the digest of every record's stored CRC must be the one they were built for
  (:meth:`~evenflow.records.RecordDataset.check_content`), so the label and cost columns
  describe these very records. Records an index left out as corrupt are named in a note.
* **Bad records.** Without ``skip_corrupt``, a record that fails while training is
  named afterwards by :meth:`RecordSource.find_bad_record` (``LoadedData.diagnose``).
  With it, every CRC is checked and every image decoded (Pillow) before training;
  records that fail are left out of both splits and listed.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evenflow.data.arrays import check_dense_labels, split_facts, split_indices, split_text
from evenflow.data.identity import data_identity, digest
from evenflow.records.digest import content_digest
from evenflow.data.images import DecodeImages, first_image_layout, skip_undecodable, skipped_note
from evenflow.data.loaded import LoadedData
from evenflow.data.plain import open_for_training
from evenflow.data.records_source import RecordSource
from evenflow.data.sequences import PadSequences, describe_lists, settle_lists, token_vocabulary
from evenflow.data.source import SubsetSource
from evenflow.data.pad_lengths import pad_lengths_of
from evenflow.data.text import VOCAB_SIZE, DecodeText, check_pad_lengths
from evenflow.records.errors import RecordError

# Datasets up to this many bytes of shards are decoded once and held in memory.
CACHE_BYTES = 1 << 30
# Defaults of the feature_key / label_key options: for records they mean "the manifest's".
_DEFAULT_FEATURE, _DEFAULT_LABEL = "x", "y"
_CHUNK = 4096  # records decoded at a time to measure text lengths


def manifest_keys(ds, options, where: str) -> tuple[str | None, str]:
    """(feature key or None for "choose", label key) of a converted dataset, checked against the records."""
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


def text_lengths(ds, key: str) -> np.ndarray:
    """int64 ``[N]``: bytes (tokens) of text feature ``key`` per record, read from the records.

    Not taken from the cost column, which may be any cost; decoding is ~2 µs per record.
    """
    out = np.zeros(len(ds), np.int64)
    for lo in range(0, len(ds), _CHUNK):
        ids = np.arange(lo, min(lo + _CHUNK, len(ds)))
        out[ids] = [len(b) for b in ds.decode_batch(ids, keys=[key])[key]]
    return out


class _Feature(NamedTuple):
    """How training reads the feature: the decoder, one sample's shape, a note for the
    description, the records that read (bool ``[N]``), and the vocabulary of token ids."""

    decode: object
    shape: tuple
    note: str
    good: np.ndarray
    vocab: int | None = None


def _pad_note(pad_lengths) -> str:
    return "padded per batch" if pad_lengths is None else f"padded to {','.join(str(n) for n in pad_lengths)}"


def _text_decode(ds, feature_key: str, options, good) -> _Feature:
    """The decoder of text records; refuses an empty text or short ``pad_lengths``."""
    lengths = text_lengths(ds, feature_key)
    if lengths.min() < 1:
        path, rec, off = ds._where(int(np.argmin(lengths)))
        raise RecordError(path, f"text {feature_key!r} is empty; every sequence needs at least one token: "
                          f"leave such records out when converting", record=rec, offset=off, kind="feature")
    pad_lengths = check_pad_lengths(pad_lengths_of(options), int(lengths.max()))
    described = (f"text, {int(lengths.min())}-{int(lengths.max())} tokens (mean {lengths.mean():.0f}), "
                 f"{_pad_note(pad_lengths)}")
    return _Feature(DecodeText(pad_lengths), (None,), f" ({described})", good, VOCAB_SIZE)


def _list_decode(ds, key: str, scan, options, where: str, good) -> _Feature:
    """The decoder of a variable-length list: token ids (int64, read as ``id + 1``) or float32 values."""
    spec = ds.specs[key]
    pad_lengths = check_pad_lengths(pad_lengths_of(options), int(scan.lengths.max()))
    stats = f"{describe_lists(scan, spec.dtype)}, {_pad_note(pad_lengths)}"
    if spec.dtype != "int64":
        return _Feature(PadSequences(pad_lengths), (None,), f" (variable-length float32: {stats})", good)
    vocab = token_vocabulary(scan, key, where)
    return _Feature(PadSequences(pad_lengths, shift=1), (None,),
                    f" (variable-length token ids: {stats}; read as id + 1, vocabulary {vocab})", good, vocab)


def _decoder(ds, feature_key: str, options, skip: bool, skipped: list) -> _Feature:
    """How training reads the feature ``feature_key``."""
    spec, where = ds.specs[feature_key], ds.manifest_path or options.dataset
    good = np.ones(len(ds), bool)
    if ds.holds_text(feature_key):  # variable-length text, e.g. `evenflow convert builtin:stdlib-docs`
        return _text_decode(ds, feature_key, options, good)
    scan, _ = settle_lists(ds, feature_key)  # a list that varies (plain files: read from every record once)
    if scan is not None:
        return _list_decode(ds, feature_key, scan, options, where, good)
    if spec.dtype == "bytes":
        layout = first_image_layout(ds, feature_key, skip)  # with skip_corrupt, of the first image that opens
        if skip:
            good &= skip_undecodable(ds, feature_key, layout, skipped)
        return _Feature(DecodeImages(tuple(layout)), tuple(layout), " (decoded images)", good)
    if len(spec.shape) < 1:
        raise ValueError(f"{where}: feature {feature_key!r} is one number per record; a classifier needs at "
                         f"least one feature axis, pick another --feature-key")
    return _Feature(None, tuple(int(d) for d in spec.shape), "", good)


def _left_out_note(ds) -> tuple[str, ...]:
    """One line per shard whose index left records out as corrupt (``evenflow index --skip-corrupt``)."""
    return tuple(f"{s.path}: its index leaves {s.skipped:,} corrupt records out (evenflow index --skip-corrupt); "
                 f"they are not trained" for s in ds.shards if s.skipped)


def load_records(options) -> LoadedData:
    """Load the records ``options.dataset`` (see the module docstring).

    Args:
        options: data options (``dataset``, ``feature_key``, ``label_key``, ``test_fraction``,
            ``split_seed``, ``skip_corrupt``, ``pad_lengths``).

    Raises:
        RecordError: a missing or stale index, a key the records do not hold, an
            image that does not decode; one line naming the file (and record).
        ValueError: too few samples to split, fewer than 2 classes.
    """
    path = options.dataset
    skip = bool(getattr(options, "skip_corrupt", False))
    ds, plain, keys = open_for_training(path, options.feature_key, options.label_key, skip)
    ds.check_content()  # the label and cost columns describe these records: every stored CRC, 4 bytes a record
    where = ds.manifest_path or path
    # No manifest: keys from the first record, labels from the sidecars or the records.
    feature_key, label_key = keys if plain else manifest_keys(ds, options, where)
    feature_key = ds.training_keys(feature_key, label_key)
    skipped = [b.to_json() for b in ds.bad]
    decode, shape, kind, good, vocab = _decoder(ds, feature_key, options, skip, skipped)
    size = sum(s.file_size for s in ds.shards)
    cache = size <= CACHE_BYTES
    source = RecordSource(ds, feature_key, label_key, decode=decode, cache=cache, verify=True)
    source.preload()  # cached: every CRC is checked now, before a framework starts and anything is written

    ids = np.flatnonzero(good).astype(np.int64)
    labels = ds.labels[ids]
    if labels.min() < 0:
        raise ValueError(f"{where}: labels must be integers 0..K-1, but the index holds a label {int(labels.min())}; "
                         f"map the classes to 0..K-1 (numpy.unique(y, return_inverse=True)) and convert again")
    num_classes = max(int(labels.max()) + 1, len(ds.class_names or []))
    check_dense_labels(labels, num_classes, where, named=len(ds.class_names or []))
    if num_classes < 2:
        raise ValueError(f"{where}: a classifier needs at least 2 classes, but every label is {int(labels.max())}")
    train, test = split_indices(labels, options.test_fraction, options.split_seed)
    if len(train) == 0 or (len(test) == 0 and options.test_fraction > 0):
        raise ValueError(f"{where}: {len(ids)} samples are too few to split with test_fraction "
                         f"{options.test_fraction:g}; use more samples or another test_fraction")

    def diagnose(error):
        return source.find_bad_record(ids)

    reading = "cached in memory" if cache else "read by offset"
    split = split_facts(ids[train], ids[test], options.test_fraction, options.split_seed)
    identity = data_identity(digest(content_digest(ds), ids), shape, split, (feature_key, label_key))
    return LoadedData(
        train=SubsetSource(source, ids[train]), test=SubsetSource(source, ids[test]) if len(test) else None,
        num_classes=num_classes, feature_shape=shape,
        description=f"{path}: {'TFRecord files' if plain else 'records'} ({len(ds)} in {len(ds.paths)} shards, "
                    f"{size / 1e6:.1f} MB, {reading}), "
                    f"{split_text(len(train), len(test))}, {num_classes} classes, feature "
                    f"{feature_key!r} {shape}{kind}",
        notes=skipped_note(skipped) + _left_out_note(ds), diagnose=diagnose, skipped=tuple(skipped), kind="records", records=source,
        split=split, identity=identity, keys=(feature_key, label_key), dataset_ids=ids[train],
        class_names=tuple(ds.class_names) if ds.class_names else None, vocab_size=vocab)
