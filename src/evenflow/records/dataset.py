"""Random access to a sharded TFRecord dataset through its sidecar indexes.

:class:`RecordDataset` opens a dataset directory (shards + ``.idx`` + ``dataset.json``)
or a list of TFRecord files with ``.idx`` sidecars, checks every index against its file
(:mod:`evenflow.records.dataset_open`), and numbers the records ``0..N-1`` in shard order:
the sample ids the planner uses. A batch of ids is read from memory-mapped files (a slice
copy per record, or one vectorised byte gather per shard for tiny records:
:mod:`evenflow.records.batch_read`), returned as one contiguous buffer plus per-record
starts and lengths, the shape a ``tf.strings.substr`` or a zero-copy torch reader wants.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Sequence

import numpy as np

from evenflow.records.batch_read import copy_slices, gather_bytes
from evenflow.records.batch_verify import verify_batch
from evenflow.records.dataset_open import check_shards, open_shard, resolve_paths, sample_columns
from evenflow.records.errors import RecordError
from evenflow.records.example.decode import decode_examples
from evenflow.records.example.feature_keys import resolve_specs, training_feature_key
from evenflow.records.tfrecord.frame import FRAME_BYTES, HEADER_BYTES
from evenflow.records.tfrecord.walk import open_mmap
from evenflow.records.sidecar import ShardIndex
from evenflow.records.example.spec import FeatureSpec
from evenflow.records.trust import check_content, refuse_copies
from evenflow.records.example.varlen import ListScan, scan_list
from evenflow.records.shard_files import (close_mirrors, fetch_all, fetch_checked, fill, local_files, named_by_url,
                                          open_mirrors, remote_stats)
from evenflow.util.ids import sample_ids
from evenflow.util.validate import check_choice

CHECKS = ("ends", "headers", "crc")


def _named(s: ShardIndex, path: str) -> ShardIndex:
    """The index of a shard read from a local mirror, named by the shard's own path (its URL)."""
    if s.path == path:
        return s
    return dataclasses.replace(s, path=path, rebuild=s.rebuild.replace(s.path, path))
# Mean record size (bytes) from which a batch is read as one slice copy per record rather
# than one byte-level gather per shard (see RecordDataset.read_batch_buffer).
GATHER_BYTES = 48


class RecordDataset:
    """A sharded TFRecord dataset with random access by sample id.

    Args:
        path: a dataset directory (with ``dataset.json``), its ``dataset.json``, one
            TFRecord file, or a list of TFRecord files (each with its ``.idx``); local paths or
            object-store URLs (``s3://…``: read through the block cache of
            :mod:`evenflow.records.shard_files`, configured by ``EVENFLOW_CACHE_DIR`` and friends).
        features: feature keys to decode (a subset of the manifest's), or key ->
            :class:`FeatureSpec`; default all features of the manifest, or, without a
            manifest, what the first record holds.
        check: how much to check on open. ``"ends"``: each index covers its file exactly
            (sizes, contiguity); the headers and stored data CRCs of the first, the last and
            ~64 sampled records are those the sidecars describe. ``"headers"``: also every
            record's length field and stored CRC (one vectorised pass). ``"crc"``: also every
            length and data CRC (reads everything).
        skip_corrupt: leave records with a bad CRC out of the sample ids instead of
            raising (implies ``check="crc"``); they are listed in :attr:`bad`.

    Attributes:
        num_samples: N, the records numbered ``0..N-1`` in shard order (``len(ds)``).
        labels: int64 ``[N]`` from the ``.meta.npz`` sidecars (or :meth:`set_labels`), or None.
        costs: float64 ``[N]`` from the sidecars, or None. With ``len(ds)`` and ``labels``,
            what the planner's index is built from (``evenflow.Index.from_records``).
        bad: the records ``skip_corrupt`` left out.

    Raises:
        RecordError: missing, mismatching or stale sidecars, a file listed twice or a shard
            copied under another name, corrupt record, unknown feature key.
    """

    def __init__(self, path, *, features: Sequence[str] | Mapping[str, FeatureSpec] | None = None,
                 check: Literal["ends", "headers", "crc"] = "ends", skip_corrupt: bool = False):
        check_choice("check", check, CHECKS)
        if skip_corrupt and check != "crc":
            check = "crc"  # corrupt records are only found by checking CRCs
        self.paths, self.manifest, self.manifest_path, self.manifest_file = resolve_paths(path)
        self.skip_corrupt = skip_corrupt
        self._mirrors = open_mirrors(self.paths)  # remote shards: read through the block cache
        files = local_files(self.paths, self._mirrors)
        with named_by_url(self._mirrors):
            self._shards: list[ShardIndex] = [_named(open_shard(i, f, self.manifest, self.manifest_path), p)
                                              for i, (f, p) in enumerate(zip(files, self.paths))]
            # Plain uint8 views of read-only maps (np.memmap's subclass overhead shows in small gathers).
            self._mms = [open_mmap(f) if m is None else m.mm for f, m in zip(files, self._mirrors)]
            self._maps = [np.frombuffer(m, dtype=np.uint8) for m in self._mms]
            fetch_checked(self._shards, self._mirrors, check)
            self._shards, self.bad = check_shards(self._shards, self._maps, check, skip_corrupt, files)
            refuse_copies(self._shards, self._maps, self.manifest_path or self.paths[0])
        self._build_arrays()
        self._features = features
        self._specs: dict[str, FeatureSpec] | None = None
        self._guessed = self.manifest is None and not isinstance(features, Mapping)  # specs from record 0
        self._lists: dict[str, ListScan] = {}
        if features is not None or self.manifest is not None:
            self._specs = resolve_specs(self, features)  # validate requested keys now

    @property
    def specs(self) -> dict[str, FeatureSpec]:
        """key -> :class:`FeatureSpec` of the features :meth:`decode_batch` returns.

        From the manifest, or guessed from the first record when there is none (and only
        then read, so datasets of non-Example records open fine).
        """
        if self._specs is None:
            self._specs = resolve_specs(self, self._features)
        return self._specs

    def check_content(self) -> None:
        """Compare every record's stored data CRC with those its shard's sidecars were built for (4 bytes
        a record), so the label and cost columns describe these very records (shards whose corrupt
        records were left out on open compared their sampled records then).

        Raises:
            RecordError: records rewritten since the sidecars were built, or damaged since.
        """
        self.fetch()
        for s, data in zip(self._shards, self._maps):
            check_content(s, data, full=True)

    def fetch(self, ids=None) -> None:
        """Fetch into the block cache the bytes of the given sample ids (default all) of the remote shards
        not cached yet (nothing for local shards); every reading method does it for what it reads."""
        if not all(m is None or m.complete for m in self._mirrors):
            if ids is None:
                fetch_all(self._mirrors)
            else:
                ids = self._ids(ids)
                fill(self._mirrors, self.sample_shard[ids], self.sample_offset[ids], self.sample_length[ids])

    @property
    def remote_stats(self) -> dict:
        """``{"requests": ranged GETs, "bytes": bytes fetched}`` of the remote shards since open."""
        return remote_stats(self._mirrors)

    def _build_arrays(self) -> None:
        cols = sample_columns(self._shards)
        self.num_samples = int(cols.shard_starts[-1])
        self.shard_starts, self.sample_shard, self.sample_offset, self.sample_length, self.labels, self.costs = cols

    # -- public surface ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        feats = sorted(self._specs) if self._specs is not None else "?"
        return f"RecordDataset({len(self._shards)} shards, num_samples={self.num_samples}, features={feats})"

    @property
    def shards(self) -> list[ShardIndex]:
        """The validated index of each shard, in sample-id order."""
        return list(self._shards)

    @property
    def label_key(self) -> str | None:
        return self.manifest.label_key if self.manifest else None

    @property
    def cost_key(self) -> str | None:
        return self.manifest.cost_key if self.manifest else None

    @property
    def class_names(self) -> list[str] | None:
        return self.manifest.class_names if self.manifest else None

    def training_keys(self, feature_key: str | None, label_key: str) -> str:
        """Check the keys a training source reads; returns the feature key.

        Args:
            feature_key: the features' key, or None to take the manifest's image key or
                else the only key that is neither the label nor the cost.
            label_key: must be one int64 per record.

        Raises:
            ValueError: a key the records do not hold, or no single feature key to choose.
        """
        specs = self.specs
        image = (self.manifest.image or {}) if self.manifest is not None else {}
        return training_feature_key(specs, self.manifest_path or self.paths[0], feature_key, label_key,
                                    image_key=image.get("key"), cost_key=self.cost_key)

    def set_labels(self, labels) -> None:
        """Use ``labels`` (int ``[N]``, e.g. read from the records) as the label column :attr:`labels`.

        Raises:
            ValueError: not one integer label per sample.
        """
        labels = np.asarray(labels)
        if labels.shape != (self.num_samples,) or labels.dtype.kind not in "iu":
            raise ValueError(f"labels must be integers of shape ({self.num_samples},), one per sample, got "
                             f"{labels.dtype} {labels.shape}")
        self.labels = labels.astype(np.int64, copy=False)

    def scan_list(self, key: str) -> ListScan:
        """Lengths and value range of float32/int64 list feature ``key`` in every record
        (:func:`~evenflow.records.example.varlen.scan_list`; read once, then remembered). Without a manifest,
        a key whose shape was guessed from the first record becomes variable-length (``(None,)``)
        in :attr:`specs` when its lengths differ."""
        if key not in self._lists:
            found = self._lists[key] = scan_list(self, key)
            if self._guessed and found.varies:
                self._specs[key] = FeatureSpec(self._specs[key].dtype, (None,))
        return self._lists[key]

    def holds_text(self, key: str) -> bool:
        """Whether feature ``key`` is text: one ``bytes`` value per record in a dataset whose
        manifest does not name it as its image (``evenflow convert builtin:stdlib-docs``).
        Without a manifest a ``bytes`` feature counts as an encoded image."""
        spec = self.specs.get(key)
        if spec is None or spec.dtype != "bytes" or spec.shape not in ((), (1,)) or self.manifest is None:
            return False
        return (self.manifest.image or {}).get("key") != key

    def locate(self, ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard int32, offset int64, framed length int64)`` of each sample id."""
        ids = self._ids(ids)
        return self.sample_shard[ids], self.sample_offset[ids], self.sample_length[ids]

    def _ids(self, ids) -> np.ndarray:
        return sample_ids(ids, self.num_samples)

    def _where(self, i: int) -> tuple[str, int, int]:
        """``(shard path, record number in shard, offset)`` of sample id ``i``."""
        sh = int(self.sample_shard[i])
        shard, k = self._shards[sh], i - int(self.shard_starts[sh])
        # With skip_corrupt the ids skip the corrupt records; the number is the record's own.
        record = k if shard.numbers is None else int(shard.numbers[k])
        return shard.path, record, int(self.sample_offset[i])

    def read_batch_buffer(self, ids, *, verify: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The data of the given records as one contiguous buffer.

        Small records (under :data:`GATHER_BYTES` on average) are gathered byte by byte
        with one vectorised fancy index per distinct shard in the batch; larger ones are
        copied as one slice each from the memory map. The byte gather needs an int64
        source index per byte, which stops paying off above a few dozen bytes per record
        (measured: see docs/benchmarks.md).

        Args:
            ids: sample ids, int ``[B]``, each in ``0..N-1``, repeats allowed.
            verify: check each record's length field and length/data CRCs (a loop over
                the batch in C-backed CRC calls).

        Returns:
            ``(buffer uint8 [sum(lengths)], starts int64 [B], lengths int64 [B])``:
            record ``j``'s serialized data is ``buffer[starts[j]:starts[j] + lengths[j]]``.

        Raises:
            RecordError: with ``verify``, a record whose CRC does not match.
            IndexError: an id out of range.
        """
        ids = self._ids(ids)
        self.fetch(ids)
        shard, data_off, lengths, starts = self._spans(ids)
        total = int(lengths.sum()) if ids.size else 0
        buffer = np.empty(total, dtype=np.uint8)
        if ids.size and total >= GATHER_BYTES * ids.size:
            copy_slices(self._maps, shard, data_off, lengths, starts, buffer)
        elif ids.size:
            gather_bytes(self._maps, shard, data_off, lengths, starts, buffer)
        if verify:
            verify_batch(self._maps, shard, self.sample_offset[ids], buffer, starts, lengths,
                         lambda j: self._where(int(ids[j])))
        return buffer, starts, lengths

    def read_batch_bytes(self, ids, *, verify: bool = False) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Like :meth:`read_batch_buffer`, as one ``bytes`` object (``verify`` checks the same, on it).

        One ``bytes.join`` of slices of the file maps, cheaper than slice copies into a numpy
        buffer plus its ``tobytes()`` (measured: see docs/benchmarks.md). This is what a TensorFlow reader wants: it becomes one
        ``tf.string`` scalar, cut into records by ``tf.strings.substr``.
        """
        ids = self._ids(ids)
        self.fetch(ids)
        shard, begin, lengths, starts = self._spans(ids)
        mms = self._mms
        raw = b"".join([mms[s][a:b] for s, a, b in zip(shard.tolist(), begin.tolist(), (begin + lengths).tolist())])
        if verify and ids.size:
            verify_batch(self._maps, shard, self.sample_offset[ids], raw, starts, lengths,
                         lambda j: self._where(int(ids[j])))
        return raw, starts, lengths

    def _spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per id: its shard, its data's offset in the shard, its data length, and its start in a joined batch."""
        lengths = self.sample_length[ids] - FRAME_BYTES
        return self.sample_shard[ids], self.sample_offset[ids] + HEADER_BYTES, lengths, np.cumsum(lengths) - lengths

    def read_batch(self, ids, *, verify: bool = False) -> list[bytes]:
        """The serialized records of the given ids, as a list of ``bytes``."""
        buffer, starts, lengths = self.read_batch_buffer(ids, verify=verify)
        raw = buffer.tobytes()
        return [raw[s:s + n] for s, n in zip(starts.tolist(), lengths.tolist())]

    def decode_batch(self, ids, *, keys: Sequence[str] | None = None, verify: bool = False) -> dict[str, np.ndarray]:
        """Read and decode the given ids into arrays ``[B, *shape]`` per feature.

        Args:
            ids: sample ids ``[B]``.
            keys: subset of :attr:`specs` to decode (default all), or key -> :class:`FeatureSpec`
                to decode them with (e.g. a variable-length view of a fixed-size list).
            verify: check CRCs while reading.

        Raises:
            RecordError: a record that lacks a feature or has another type or shape, naming
                its shard, record number and offset.
        """
        ids = self._ids(ids)
        specs = self.specs if keys is None else dict(keys) if isinstance(keys, Mapping) else \
            {k: self._spec(k) for k in keys}
        triple = self.read_batch_buffer(ids, verify=verify)
        try:
            return decode_examples(triple, specs)
        except RecordError as e:
            if e.path is not None or e.record is None:
                raise
            path, rec, off = self._where(int(ids[e.record]))
            raise RecordError(path, e.reason, record=rec, offset=off, kind=e.kind) from e

    def _spec(self, key: str) -> FeatureSpec:
        if key not in self.specs:
            raise RecordError(self.manifest_path or self.paths[0], f"feature key {key!r} is not in the records; "
                              f"they hold {', '.join(sorted(self.specs))}", kind="feature")
        return self.specs[key]

    def close(self) -> None:
        """Drop the file maps (they are also released when the dataset is garbage collected)."""
        self._maps = []
        self._mms = []
        close_mirrors(self._mirrors)
        self._mirrors = []

    def __enter__(self) -> "RecordDataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
