"""Plan batches for Keras's ``model.fit``/``evaluate``: whole global steps that Keras splits per replica.

Each element of :func:`keras_dataset` is ``(features, label, meta)`` for one global step of
the plan: the R replicas' batches back to back (``R * slots`` rows in replica order), which
Keras's even split under ``MirroredStrategy`` hands back to each replica as exactly its row of
the plan. ``meta`` holds, per row, ``mask`` (1 real, 0 padding), ``global_real_count`` (the
step's real samples), ``id`` (the sample id, -1 for padding) and ``replica`` (the plan replica
whose row it is: the exact steps check that each replica got its own), and with ``weights``
also ``weight`` (the sample's weight, 0 for padding). The steps that read ``meta``
are installed by :func:`~evenflow.tf.keras.steps.exact_steps` (``evenflow.tf.fit`` does both).
"""
from __future__ import annotations

import numbers

import numpy as np

from evenflow.plan import Cursor, Plan
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.reader import PlanReader
from evenflow.tf.strategy import local_replicas

META_KEYS = ("mask", "global_real_count", "id", "replica")
WEIGHT = "weight"  # the optional meta key of per-sample weights


def keras_dataset(reader, plan: Plan, epochs: int | None = 1, start: Cursor | None = None, repeat: bool = False,
                  weights=None):
    """A ``(features, label, meta)`` dataset of whole global steps of ``plan``.

    Args:
        reader: a :class:`~evenflow.tf.input.reader.PlanReader` over the plan's source.
        plan: the plan; its topology must have the strategy's number of replicas
            (:func:`~evenflow.tf.strategy.topology_of`): the exact steps fail a step whose
            replica did not get its own row of the plan.
        epochs: epochs to stream from ``start`` (None: endless). Pass
            ``steps_per_epoch=plan.num_steps`` to ``fit``.
        start: optional :class:`~evenflow.plan.cursor.Cursor` to resume from.
        repeat: repeat the epochs read without end (validation: one pass per ``evaluate``
            with ``validation_steps=plan.num_steps``).
        weights: optional per-sample weights ``[N]`` of the plan's source, read by sample id
            (``model.fit``'s ``sample_weight``; the exact steps weight the loss and the
            ``weighted_metrics`` by them).

    Returns:
        A ``tf.data.Dataset``.
    """
    tf = _tf()
    epochs = _check_arguments(reader, plan, epochs, start, repeat)
    ds = reader.replica_dataset(plan, None, start=start, epochs=epochs)
    replica = tf.constant(np.repeat(np.arange(plan.topology.replicas, dtype=np.int64), plan.slots))
    table = None if weights is None else _weight_table(weights, plan)

    def to_keras(b):
        rows = tf.shape(b["mask"])[0]
        meta = {"mask": b["mask"], "global_real_count": tf.fill([rows], tf.cast(b["global_real_count"], tf.int64)),
                "id": b["id"], "replica": replica}
        if table is not None:
            meta[WEIGHT] = tf.gather(table, tf.maximum(b["id"], 0)) * tf.cast(b["mask"], tf.float32)
        return b["features"], b["label"], meta

    ds = ds.map(to_keras)
    return ds.repeat() if repeat else ds


def keras_worker_dataset(strategy, reader, plan: Plan, epochs: int, start: Cursor | None = None,
                         repeat: bool = False, weights=None):
    """:func:`keras_dataset` for a ``MultiWorkerMirroredStrategy``: a distributed dataset of the plan's steps.

    Each worker reads only the rows of its own replicas (``PlanReader.worker_dataset``), as
    ``(features, label, meta)`` per replica and step, and ``distribute_datasets_from_function``
    hands them to its replicas in order; Keras takes a distributed dataset as it is.
    """
    tf = _tf()
    epochs = _check_arguments(reader, plan, epochs, start, repeat)
    local = local_replicas(strategy)
    table = None if weights is None else _weight_table(weights, plan)

    def dataset_fn(ctx):
        first = ctx.input_pipeline_id * local
        ds = reader.worker_dataset(plan, range(first, first + local), start=start, epochs=epochs)

        def to_keras(k, b):
            rows = tf.shape(b["mask"])[0]
            meta = {"mask": b["mask"], "global_real_count": tf.fill([rows], tf.cast(b["global_real_count"], tf.int64)),
                    "id": b["id"], "replica": tf.fill([rows], first + k % local)}
            if table is not None:
                meta[WEIGHT] = tf.gather(table, tf.maximum(b["id"], 0)) * tf.cast(b["mask"], tf.float32)
            return b["features"], b["label"], meta

        ds = ds.enumerate().map(to_keras)
        return ds.repeat() if repeat else ds

    mode = tf.distribute.InputReplicationMode.PER_WORKER
    return strategy.distribute_datasets_from_function(dataset_fn, options=tf.distribute.InputOptions(
        experimental_replication_mode=mode, experimental_fetch_to_device=False))


def _weight_table(weights, plan: Plan):
    tf = _tf()
    w = np.asarray(weights, np.float32)
    if w.shape != (plan.index.num_samples,):
        raise ValueError(f"weights must be one weight per sample of the plan, shape ({plan.index.num_samples},), "
                         f"got shape {w.shape}")
    with tf.init_scope(), tf.device("/cpu:0"):
        return tf.constant(w)


def _check_arguments(reader, plan, epochs, start, repeat):
    """``epochs`` as an int (numpy integers taken) or None; the rest refused in one line each."""
    if not isinstance(reader, PlanReader):
        hint = "wrap the source in evenflow.tf.PlanReader(source)" if hasattr(reader, "batch") else \
            "pass evenflow.tf.PlanReader(source)"
        raise TypeError(f"keras_dataset reads through a PlanReader: {hint}; got {type(reader).__name__}")
    if reader.trim_padding:
        raise ValueError("keras_dataset needs the plan's whole rows: Keras splits each global step evenly, so "
                         "replica r gets its own row only if no padding slot is dropped; use a PlanReader "
                         "without trim_padding (the exact steps mask the padding out of the loss and metrics)")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
    if start is not None and not isinstance(start, Cursor):
        raise TypeError(f"start must be an evenflow Cursor (evenflow.Cursor(epoch, step)) or None, got {start!r}")
    if not isinstance(repeat, bool):
        raise TypeError(f"repeat must be True or False, got {repeat!r}")
    if isinstance(epochs, numbers.Integral) and not isinstance(epochs, bool):
        return int(epochs)
    return epochs
