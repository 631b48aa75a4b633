"""Your own ``tf.data`` chain over TFRecord files, fed by a plan.

The usual input pipeline of a TensorFlow program is::

    ds = tf.data.TFRecordDataset(files).shuffle(10_000)
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE)        # parse_single_example
    ds = ds.map(preprocess, num_parallel_calls=AUTOTUNE)   # (image, label) -> (image, label)
    ds = ds.map(augment, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(batch_size)

:class:`RecordChain` runs the same three functions on the samples the plan gives each replica:
``RecordChain(files, parse, preprocess, augment)`` is a :class:`~evenflow.tf.input.reader.PlanReader`,
so :meth:`~evenflow.tf.input.reader.PlanReader.distribute`, :func:`~evenflow.tf.keras.data.keras_dataset`
and :class:`~evenflow.tf.trainer.Trainer` take it as they take any reader.

Each replica's pipeline reads a step's row of the plan by record number (one read of
memory-mapped files through the ``.idx`` sidecars that ``evenflow index`` writes), then runs
the functions per example with ``num_parallel_calls=AUTOTUNE`` (or once per batch with
``batched=True``) and batches the examples back into the row: the row's order, the mask and
the global real count are the plan's. An ``augment_fn`` with a ``seed`` parameter gets a
stateless seed keyed by (seed, epoch, sample id) (:func:`~evenflow.tf.input.sample_hash.sample_seeds`),
for ``tf.random.stateless_*`` and ``tf.image.stateless_random_*``: a sample is augmented the
same way on any number of replicas and after an exact resume.

Padding slots run the chain on a real record of the same row (the mask drops them); with
``trim_padding`` they are removed after the chain, so the model step does not compute them.

Every read checks each record's length field and length and data CRCs, as
``tf.data.TFRecordDataset`` does: a damaged record fails the step with a TensorFlow error
whose first line is the :class:`~evenflow.records.RecordError` (file, record number, offset),
also kept in :attr:`RecordChain.error`.
"""
from __future__ import annotations

from typing import Callable

from evenflow.plan.index import Index
from evenflow.records.dataset import CHECKS, RecordDataset
from evenflow.records.errors import RecordError
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.chain_fns import ExampleChain
from evenflow.tf.input.pipeline import finish
from evenflow.tf.input.reader import PlanReader
from evenflow.tf.input.records_source import serialized_records
from evenflow.tf.input.sample_hash import sample_seeds
from evenflow.util.validate import check_bool, check_choice, check_int

_SCALARS = ("global_real_count", "epoch")


class SerializedSource:
    """A TensorFlow source of the serialized records of a :class:`RecordDataset`: ``batch(ids)``
    gives ``{"serialized": tf.string [len(ids)]}``, read with one Python call per batch.

    With ``verify`` (the default) every read checks each record's length field and length and
    data CRCs, as ``tf.data.TFRecordDataset`` does; a bad record fails the read with its
    :class:`~evenflow.records.RecordError` (file, record number, offset), kept in :attr:`error`
    since TensorFlow passes on only its text.
    """

    def __init__(self, dataset: RecordDataset, verify: bool = True):
        self.dataset, self.verify = dataset, verify
        self.num_samples = len(dataset)
        self.error: RecordError | None = None

    def _read(self, ids):
        try:
            return self.dataset.read_batch_bytes(ids, verify=self.verify)
        except RecordError as e:
            if self.error is None:
                self.error = e
            raise

    def index(self) -> Index:
        """N, with the labels and costs of the ``.meta.npz`` sidecars when ``evenflow index`` wrote them."""
        ds = self.dataset
        return Index(self.num_samples, labels=ds.labels, costs=ds.costs)

    def batch(self, ids) -> dict:
        return {"serialized": serialized_records(self._read, _tf().cast(ids, _tf().int64))}


class RecordChain(PlanReader):
    """A plan-driven reader that runs the user's parse -> preprocess -> augment chain on TFRecord files.

    Args:
        files: a TFRecord file, a list of them (each with the ``.idx`` sidecar ``evenflow index``
            writes), a directory written by ``evenflow convert``, or an open :class:`RecordDataset`.
        parse_fn: ``fn(serialized) -> value``, e.g. ``tf.io.parse_single_example`` plus decoding.
        preprocess_fn: optional, called with the parse result (a tuple's elements as arguments,
            as ``tf.data``'s ``map`` does).
        augment_fn: optional, called with the preprocess result; with a ``seed`` parameter it
            also gets ``seed=`` an int64 ``[2]`` stateless seed of (``seed``, epoch, sample id)
            (``[batch, 2]`` with ``batched``).
        batched: the functions take a batch (``serialized`` a string vector) instead of one example.
        seed: the seed of the augmentation seeds.
        check: how much :class:`RecordDataset` checks when opening ``files`` (``"crc"`` reads
            every record once and checks its CRCs).
        prefetch, trim_padding, stamp: as for :class:`~evenflow.tf.input.reader.PlanReader`.

    The last function must return ``(features, label)`` or a dict with ``label`` (and ``features``,
    or one other key, used as ``features``, or several, which become a ``features`` dict).

    Raises:
        RecordError: a file without its ``.idx`` sidecar, or one that does not match it.
        TypeError: a function that is not callable, or whose positional arguments do not match
            what the stage before it returns (found when the pipeline is built).

    Reading checks every record's CRCs; a damaged one fails the pipeline with a TensorFlow
    error whose first line is its :class:`RecordError`, which :attr:`error` holds.
    """

    def __init__(self, files, parse_fn: Callable, preprocess_fn: Callable | None = None,
                 augment_fn: Callable | None = None, *, batched: bool = False, seed: int = 0,
                 check: str = "ends", prefetch: int = 4, trim_padding: bool = False, stamp: bool = False):
        for name, fn in (("parse_fn", parse_fn), ("preprocess_fn", preprocess_fn), ("augment_fn", augment_fn)):
            if fn is not None and not callable(fn) or (name == "parse_fn" and fn is None):
                raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
        check_bool("batched", batched)
        check_int("seed", seed)
        check_choice("check", check, CHECKS)
        dataset = files if isinstance(files, RecordDataset) else RecordDataset(files, check=check)
        self.chain = ExampleChain(parse_fn, preprocess_fn, augment_fn)
        self.batched, self.seed, self.dataset = batched, seed, dataset
        super().__init__(SerializedSource(dataset), prefetch=prefetch, trim_padding=trim_padding, stamp=stamp)

    @property
    def error(self) -> RecordError | None:
        """The first :class:`~evenflow.records.RecordError` met while reading (TensorFlow only passes
        on its text), or None."""
        return self.source.error

    def _load(self, rows_ds, prefetch: int | None = None):
        tf = _tf()
        ds = rows_ds.map(self._read_row, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if self.batched:
            ds = ds.map(self._run, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            width = rows_ds.element_spec["id"].shape[0]
            ds = ds.map(_spread).unbatch()
            ds = ds.map(self._run, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            ds = ds.batch(width, drop_remainder=True).map(_gather_scalars)
        if self.trim_padding:
            ds = ds.map(_trim)
        return finish(ds, stamp=self.stamp, prefetch=self.prefetch if prefetch is None else prefetch)

    def _read_row(self, row: dict) -> dict:
        tf = _tf()
        ids = row["id"]
        real = ids >= 0
        # A padding slot reads the largest id of its row: a real record (0 if the row is all padding).
        dummy = tf.maximum(tf.reduce_max(ids), 0)
        serialized = self.source.batch(tf.where(real, ids, dummy))["serialized"]
        out = {"serialized": serialized, "id": ids, "mask": tf.cast(real, tf.float32),
               "global_real_count": row["global_real_count"], "epoch": row["epoch"]}
        if self.chain.seeded:
            out["seed"] = sample_seeds(self.seed, row["epoch"], ids)
        return out

    def _run(self, element: dict) -> dict:
        out = self.chain(element)
        out.update({k: element[k] for k in ("id", "mask", *_SCALARS)})
        return out

    def __repr__(self):
        return f"RecordChain({self.dataset!r}, batched={self.batched}, seed={self.seed})"


def _spread(batch: dict) -> dict:
    """Give the row's scalars one copy per slot, so the row can be unbatched into examples."""
    tf = _tf()
    n = tf.shape(batch["id"])[0]
    return {**batch, **{k: tf.fill([n], batch[k]) for k in _SCALARS}}


def _gather_scalars(batch: dict) -> dict:
    """Undo :func:`_spread` on a row batched back together."""
    return {**batch, **{k: batch[k][0] for k in _SCALARS}}


def _trim(batch: dict) -> dict:
    """Drop the padding slots (real ones first, in the plan's order; at least one slot stays)."""
    tf = _tf()
    real = batch["id"] >= 0
    keep = tf.maximum(tf.reduce_sum(tf.cast(real, tf.int32)), 1)
    order = tf.argsort(tf.cast(~real, tf.int32), stable=True)[:keep]
    rows = {k: v for k, v in batch.items() if k not in _SCALARS}
    out = tf.nest.map_structure(lambda t: tf.gather(t, order), rows)
    return {**out, **{k: batch[k] for k in _SCALARS}}
