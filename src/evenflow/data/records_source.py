"""A :class:`~evenflow.data.source.Source` over evenflow records, in numpy: ready features for any consumer.

:class:`RecordSource` reads the records a batch needs through
:class:`evenflow.records.RecordDataset` (one vectorised gather per shard) and decodes them
with the numpy Example decoder, so it runs anywhere numpy does, e.g. inside PyTorch
``DataLoader`` worker processes. What it returns depends on ``decode``:

* numeric features: ``features`` as float32 (``scale`` applied), ``label`` int64;
* encoded images with :class:`~evenflow.data.images.DecodeImages`: decoded by Pillow to
  float32 ``[B, H, W, C]`` in [0, 1];
* text with :class:`~evenflow.data.text.DecodeText`: token ids padded per batch, and ``length``;
* a variable-length list (:mod:`evenflow.data.sequences`): padded per batch by default, with
  ``length``; the lengths are the costs unless the sidecars hold a cost column;
* ``raw_images=True``: the encoded bytes under ``image``, for a consumer that decodes them itself.

Its attributes (``dataset``, ``feature_key``, ``label_key``, ``cache``, ``verify``,
``decode``) are also what a framework adapter reads to build a faster path of its own
(``evenflow.tf.tf_source``); the reading helpers it shares with such an adapter take
record numbers (``0..len(dataset)-1``), not sample ids.

Sources are pickled into worker processes when the start method is ``spawn``; the dataset's memory
maps and the in-memory cache are then left behind, and the worker reopens the shards and reads by offset.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evenflow.data.images import DecodeImages, ImageDecodeError
from evenflow.data.sequences import settle_lists
from evenflow.data.text import DecodeText
from evenflow.plan.index import Index
from evenflow.records.batch_read import subset_ids
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import RecordError
from evenflow.util.ids import sample_ids


@dataclass
class _ReadState:
    """What a source learns while reading, shared with its :meth:`RecordSource.full` sibling."""

    verified: np.ndarray | None  # bool [len(dataset)]: records whose CRCs were checked (with verify)
    error: RecordError | None = None  # the first RecordError met while reading
    cached: dict | None = None  # feature and label of every record (with cache)


class RecordSource:
    """Random access by sample id to an evenflow records dataset, as numpy arrays.

    Args:
        path: a dataset directory written by ``evenflow convert`` (or its ``dataset.json``), a
            list of TFRecord files with ``.idx`` sidecars, or an open :class:`~evenflow.records.RecordDataset`
            (its labels and ``skip_corrupt`` are kept; a worker started by ``spawn`` reopens it
            with the same ``skip_corrupt``).
        feature_key: the feature returned as ``features``; default the manifest's image key,
            or the only feature that is neither the label nor the cost.
        label_key: the integer class feature, returned as ``label``.
        ids: optional subset: sample ``i`` of this source is record ``ids[i]`` (distinct record
            numbers, as :class:`~evenflow.data.SubsetSource` takes them); default every record.
        decode: optional ``fn(batch) -> batch`` run on each batch; required for a ``bytes``
            feature (it arrives as ``"image"``) unless ``raw_images``. Default for a variable-length
            list (an object array of 1-D arrays): :class:`~evenflow.data.sequences.PadSequences`.
        scale: optional factor the numeric features are multiplied by (e.g. ``1/16`` for digits).
        cache: decode every record's feature and label once (:meth:`preload`) and serve
            batches from memory.
        verify: check the length and data CRCs of each record the first time this source
            reads it (the whole dataset at once with ``cache``).
        raw_images: return a ``bytes`` feature undecoded under ``"image"`` (no ``features``).

    Raises:
        RecordError, ValueError: a key the records do not hold (naming the dataset file); ``ids``
            that are not distinct integer record numbers (naming the one out of range or repeated).
        TypeError: a ``decode`` that is not callable.
    """

    def __init__(self, path, feature_key: str | None = None, label_key: str = "label", ids=None,
                 decode: Callable[[dict], dict] | None = None, scale: float | None = None, *,
                 cache: bool = False, verify: bool = False, raw_images: bool = False):
        if isinstance(path, RecordDataset):  # already open (e.g. with labels read from plain TFRecords)
            ds = path
            self.path = os.path.dirname(ds.manifest_path) if ds.manifest_path else list(ds.paths)
        else:
            self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else [os.fspath(p) for p in path]
            ds = RecordDataset(self.path)
        self._skip_corrupt = ds.skip_corrupt  # a reopened dataset must leave out the same records
        self.where = ds.manifest_path or ds.paths[0]
        feature_key = ds.training_keys(feature_key, label_key)
        lists, decode = settle_lists(ds, feature_key, decode)  # plain files: a list that varies is variable-length
        self._specs = {k: ds.specs[k] for k in (feature_key, label_key)}  # what a reopened dataset decodes with
        self.feature_spec = ds.specs[feature_key]
        self.is_encoded = self.feature_spec.dtype == "bytes"
        if self.is_encoded and decode is None and not raw_images:
            raise ValueError(f"{self.where}: feature {feature_key!r} holds encoded bytes; pass decode=fn(batch) -> "
                             f"batch that turns batch['image'] into batch['features'] (e.g. DecodeImages), "
                             f"or raw_images=True")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be a function batch -> batch, got {type(decode).__name__}")
        self.feature_key, self.label_key, self.decode, self.scale = feature_key, label_key, decode, scale
        self.cache, self.verify = bool(cache), bool(verify)
        self.records = None if ids is None else subset_ids(ids, len(ds))
        self.num_samples = len(ds) if self.records is None else int(self.records.size)
        costs = ds.costs if ds.costs is not None or lists is None else lists.lengths.astype(np.float64)
        self._labels, self._costs, self._index, self._full = ds.labels, costs, None, None
        self._state = _ReadState(np.zeros(len(ds), bool) if self.verify else None)
        self._ds, self._pid = ds, os.getpid()

    # -- what adapters read ------------------------------------------------------------------------
    @property
    def dataset(self) -> RecordDataset:
        """The open records dataset (reopened with this source's specs in a worker started by ``spawn``)."""
        if self._ds is None:
            self._ds = RecordDataset(self.path, features=self._specs, skip_corrupt=self._skip_corrupt)
        return self._ds

    @property
    def feature_shape(self) -> tuple:
        """One sample's features: the image layout, ``(None,)`` for text and varying lists, else the spec's."""
        if isinstance(self.decode, DecodeImages):
            return tuple(self.decode.layout)
        if isinstance(self.decode, DecodeText):
            return (None,)
        return self.feature_spec.shape

    @property
    def error(self) -> RecordError | None:
        """The first :class:`~evenflow.records.RecordError` met while reading (by this source or its
        :meth:`full` sibling), or None. A framework reading in its own threads only passes on the
        text of an error; this is the error itself."""
        return self._state.error

    def full(self) -> "RecordSource":
        """This source over every record of its dataset: itself without ``ids``, else a sibling that
        shares the dataset, the CRC bookkeeping, the cache and :attr:`error`."""
        if self.records is None:
            return self
        if self._full is None:
            full = object.__new__(RecordSource)
            full.__dict__.update(self.__dict__)  # not copy.copy: that pickles, which drops the shared state
            full.records, full.num_samples, full._index, full._full = None, len(self.dataset), None, None
            self._full = full
        return self._full

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ds"], state["_full"] = None, None
        # A spawned worker reads by offset rather than decoding everything again.
        state["_state"] = _ReadState(self._state.verified, self._state.error)
        return state

    def index(self) -> Index:
        """N, the sidecars' labels and costs (else a variable-length list's lengths), of the records ``ids``."""
        if self._index is None:
            labels = self._labels if self.records is None or self._labels is None else self._labels[self.records]
            costs = self._costs if self.records is None or self._costs is None else self._costs[self.records]
            self._index = Index(self.num_samples, labels=labels, costs=costs)
        return self._index

    # -- reading records (by record number) ---------------------------------------------------------
    def _note(self, error: RecordError) -> None:
        if self._state.error is None:
            self._state.error = error

    def _check_crcs(self, records: np.ndarray) -> None:
        verified = self._state.verified
        if verified is None:
            return
        new = records[~verified[records]]
        if new.size:  # the first read of these records: check their CRCs (a second, small read)
            self.dataset.read_batch_buffer(new, verify=True)
            verified[new] = True

    def read_serialized(self, records: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The serialized Examples of ``records`` (CRCs checked once with ``verify``), as
        :meth:`RecordDataset.read_batch_bytes` gives them: ``(bytes, starts int64 [B], lengths int64 [B])``."""
        try:
            self._check_crcs(records)
            return self.dataset.read_batch_bytes(records)
        except RecordError as e:
            self._note(e)
            raise

    def preload(self) -> None:
        """With ``cache``: read and decode every record's feature and label now (CRCs checked if ``verify``).

        A bad record then raises its :class:`~evenflow.records.RecordError` here, before any
        framework starts. No-op without ``cache`` or when already loaded.
        """
        state = self._state
        if not self.cache or state.cached is not None:
            return
        try:
            state.cached = self.dataset.decode_batch(np.arange(len(self.dataset), dtype=np.int64),
                                                     keys=[self.feature_key, self.label_key], verify=self.verify)
        except RecordError as e:
            self._note(e)
            raise
        if state.verified is not None:
            state.verified[:] = True

    def take_cache(self) -> dict:
        """The preloaded columns ``{feature_key: [N, ...], label_key: [N]}``, handed over: this source
        forgets them (and loads them again if it serves a batch from memory later)."""
        if not self.cache:
            raise ValueError(f"{self.where}: take_cache() needs a source made with cache=True")
        self.preload()
        cols, self._state.cached = self._state.cached, None
        return cols

    def _columns(self, records: np.ndarray) -> dict:
        # A worker process serves from a cache it inherited; it does not build one of its own.
        if self.cache and (self._state.cached is not None or os.getpid() == self._pid):
            self.preload()
            return {k: v[records] for k, v in self._state.cached.items()}
        try:
            self._check_crcs(records)
            return self.dataset.decode_batch(records, keys=[self.feature_key, self.label_key])
        except RecordError as e:
            self._note(e)
            raise

    # -- the Source protocol -----------------------------------------------------------------------
    def batch(self, ids: np.ndarray) -> dict:
        ids = np.asarray(ids, dtype=np.int64)
        records = ids if self.records is None else self.records[sample_ids(ids, self.num_samples)]  # -1 refused
        cols = self._columns(records)
        feats = cols[self.feature_key]
        out = {"image" if self.is_encoded else "features": feats,
               "label": np.asarray(cols[self.label_key]).reshape(-1).astype(np.int64, copy=False)}
        if not self.is_encoded and not self.feature_spec.varlen:
            feats = feats.astype(np.float32, copy=False)  # int64 features: the models take float32
            out["features"] = feats * np.float32(self.scale) if self.scale is not None else feats
        if self.decode is None:
            return out
        try:
            return self.decode(out)
        except ImageDecodeError as e:  # name the record, not its place in the batch
            error = self._image_error(int(records[e.position]), e.reason)
            self._note(error)
            raise error from e

    def _image_error(self, record: int, reason: str) -> RecordError:
        path, rec, off = self.dataset._where(record)
        return RecordError(path, f"image {self.feature_key!r} {reason}; replace it, or leave such records out with "
                           f"--skip-corrupt", record=rec, offset=off, kind="image")

    # -- naming a bad record -----------------------------------------------------------------------
    def find_bad_record(self, ids=None, chunk: int = 256, check_images: Callable | None = None):
        """The first record of ``ids`` (default all, in id order) that does not read, parse or decode.

        Reads ``chunk`` records at a time: CRCs, then the Example decoder (a missing feature or
        a wrong type or shape), then, for encoded images, ``check_images(records, encoded)``
        (default: Pillow through ``decode`` when it is :class:`~evenflow.data.images.DecodeImages`).
        Meant for after a pipeline failed, so it starts with :attr:`error` when reading
        already met one.

        Args:
            ids: sample ids of this source.
            chunk: records read at a time.
            check_images: ``fn(records int64 [B], encoded [B]) -> RecordError | None``, the
                decoder a framework adapter uses.

        Returns:
            A :class:`~evenflow.records.RecordError` naming the shard file, record number and
            byte offset, or None if every record is fine.
        """
        if self.error is not None:
            return self.error
        ds = self.dataset
        order = np.arange(self.num_samples, dtype=np.int64) if ids is None else np.asarray(ids, np.int64).ravel()
        order = order if self.records is None else self.records[order]
        if check_images is None and isinstance(self.decode, DecodeImages):
            check_images = self._pillow_check
        for lo in range(0, order.size, chunk):
            part = order[lo:lo + chunk]
            try:
                ds.read_batch_buffer(part, verify=True)
                cols = ds.decode_batch(part, keys=[self.feature_key, self.label_key])
            except RecordError as e:
                return e
            if self.is_encoded and check_images is not None:
                bad = check_images(part, cols[self.feature_key])
                if bad is not None:
                    return bad
        return None

    def _pillow_check(self, records: np.ndarray, encoded) -> RecordError | None:
        try:
            self.decode({self.decode.key: encoded})
        except ImageDecodeError as e:
            return self._image_error(int(records[e.position]), e.reason)
        return None

    def __repr__(self):
        return (f"RecordSource({self.path!r}, num_samples={self.num_samples}, feature_key={self.feature_key!r}, "
                f"label_key={self.label_key!r}, cache={self.cache})")
