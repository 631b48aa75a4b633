"""Plan batches for Keras's ``model.fit``/``evaluate``: whole global steps that Keras splits per replica.

Each element of :func:`keras_dataset` is ``(features, label, meta)`` for one global step of
the plan: the R replicas' batches back to back (``R * slots`` rows in replica order), which
Keras's even split under ``MirroredStrategy`` hands back to each replica as exactly its row of
the plan. ``meta`` holds, per row, ``mask`` (1 real, 0 padding), ``global_real_count`` (the
step's real samples) and ``id`` (the sample id, -1 for padding). The steps that read ``meta``
are installed by :func:`~evenflow.tf.keras_steps.exact_steps` (``evenflow.tf.fit`` does both).
"""
from __future__ import annotations

from evenflow.plan import Cursor, Plan
from evenflow.tf._lazy import tf as _tf

__all__ = ["keras_dataset", "META_KEYS"]

META_KEYS = ("mask", "global_real_count", "id")


def keras_dataset(reader, plan: Plan, epochs: int | None = 1, start: Cursor | None = None, repeat: bool = False):
    """A ``(features, label, meta)`` dataset of whole global steps of ``plan``.

    Args:
        reader: a :class:`~evenflow.tf.reader.PlanReader` over the plan's source.
        plan: the plan; its topology must have the strategy's number of replicas.
        epochs: epochs to stream from ``start`` (None: endless). Pass
            ``steps_per_epoch=plan.num_steps`` to ``fit``.
        start: optional :class:`~evenflow.plan.cursor.Cursor` to resume from.
        repeat: repeat the epochs read without end (validation: one pass per ``evaluate``
            with ``validation_steps=plan.num_steps``).

    Returns:
        A ``tf.data.Dataset``.
    """
    tf = _tf()
    ds = reader.replica_dataset(plan, None, start=start, epochs=epochs)

    def to_keras(b):
        rows = tf.shape(b["mask"])[0]
        meta = {"mask": b["mask"], "global_real_count": tf.fill([rows], tf.cast(b["global_real_count"], tf.int64)),
                "id": b["id"]}
        return b["features"], b["label"], meta

    ds = ds.map(to_keras)
    return ds.repeat() if repeat else ds
