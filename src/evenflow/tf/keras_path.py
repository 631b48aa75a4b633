"""``model.fit`` on an evenflow plan, for single-worker users who prefer Keras's loop.

Keras 3 reduces a sample-weighted loss per replica and then sums gradients over
replicas. With the default ``reduction="sum_over_batch_size"`` a replica's loss is
``sum(w * loss) / slots / R`` — divided by the *padded* batch size, so a step with
padding (the last step of an epoch, or any step of an uneven split) is
under-weighted by ``real / (R * slots)``. That is not the masked mean evenflow
promises.

It becomes exact with ``reduction="sum"`` (which Keras 3 does not rescale for
distribution) and per-sample weights ``mask / global_real_count``: each replica's
loss is then ``sum(mask * loss) / global_real_count`` — the same as the custom
trainer's — and the summed gradient is the mean over the step's real samples.
``tests/tf/test_keras_path.py`` trains both ways and compares the weights.

Caveats: metrics passed as ``weighted_metrics`` during ``fit`` see the training
weights (``1 / global_real_count``), so the last, smaller step of an epoch counts
a little more per sample in the displayed training accuracy; evaluate with
``weighting="mask"`` for exact metrics. Keras's ``model.fit`` does not work under
MultiWorkerMirroredStrategy (keras-team/keras#20585); use
:class:`~evenflow.tf.trainer.Trainer` there.
"""
from __future__ import annotations

from evenflow.plan import Cursor, Plan
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf

__all__ = ["keras_dataset", "keras_loss", "WEIGHTINGS"]

WEIGHTINGS = ("mask", "mean")


def keras_dataset(reader, plan: Plan, epochs: int | None = 1, start: Cursor | None = None,
                  weighting: str = "mean"):
    """A ``(features, label, sample_weight)`` dataset of whole global steps for ``model.fit``.

    Each element holds the R replicas' batches back to back (``R * slots`` rows in
    replica order), so Keras's even split under MirroredStrategy hands replica r
    exactly its row of the plan.

    Args:
        reader: a :class:`~evenflow.tf.reader.PlanReader`.
        plan: the plan; its topology must have the strategy's number of replicas.
        epochs: epochs to stream from ``start`` (None: endless). Pass
            ``steps_per_epoch=plan.num_steps`` to ``fit``.
        start: optional :class:`~evenflow.plan.cursor.Cursor` to resume from.
        weighting: ``"mean"`` — weights ``mask / global_real_count``, for training
            with :func:`keras_loss`; ``"mask"`` — weights ``mask``, for exact
            ``evaluate`` metrics.

    Returns:
        A ``tf.data.Dataset``.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    tf = _tf()
    ds = reader.replica_dataset(plan, None, start=start, epochs=epochs)

    def to_keras(b):
        w = b["mask"]
        if weighting == "mean":
            w = w / tf.cast(tf.maximum(b["global_real_count"], 1), tf.float32)
        return b["features"], b["label"], w

    return ds.map(to_keras)


def keras_loss():
    """Sparse softmax cross-entropy from logits with ``reduction="sum"`` (see module docstring)."""
    keras = _keras()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
