"""The masked loss that makes a padded, unevenly split step exactly the mean over its real samples.

Replica r computes ``sum_j(mask[r, j] * loss[r, j]) / global_real_count`` and the
optimizer sums gradients over replicas, so the applied gradient is the gradient
of ``sum(all real losses) / global_real_count``: the plain mean over the step's
real samples. It does not depend on how many replicas there are, how many
samples each got, or how many slots were padding. A replica with no real samples
contributes zero. (The usual ``tf.nn.compute_average_loss(..., global_batch_size)``
divides by the *nominal* batch size and so under-weights every partial step.)
"""
from __future__ import annotations

from evenflow.tf._lazy import tf as _tf


def per_sample_cross_entropy(labels, logits):
    """Softmax cross-entropy per sample, float32 ``[slots]``, from integer labels and logits."""
    tf = _tf()
    labels = tf.convert_to_tensor(labels)
    if not (labels.dtype.is_integer or labels.dtype.is_bool):
        raise ValueError(f"per_sample_cross_entropy needs integer class ids as labels, got {labels.dtype.name} "
                         f"labels; map the classes to 0..K-1 as integers, or pass your own loss_fn")
    if labels.shape.rank is not None and labels.shape.rank != 1:
        raise ValueError(f"per_sample_cross_entropy needs one class id per sample, labels of shape [slots], got "
                         f"shape {labels.shape} (one-hot rows? pass their argmax); or pass your own loss_fn")
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=tf.cast(logits, tf.float32))


def masked_loss(per_sample, mask, global_real_count):
    """One replica's share of the step loss.

    Args:
        per_sample: float ``[slots]`` loss of each slot (padding slots may hold anything finite).
        mask: float ``[slots]``, 1 for real samples, 0 for padding.
        global_real_count: int or float scalar, real samples in the step over all replicas.

    Returns:
        float32 scalar ``sum(mask * per_sample) / max(global_real_count, 1)``. Summed
        over replicas it is the mean loss of the step's real samples.
    """
    tf = _tf()
    # max(., 1): a step without real samples cannot come from a Plan, but must not divide by 0.
    denom = tf.maximum(tf.cast(global_real_count, tf.float32), 1.0)
    return masked_sum(per_sample, mask) / denom


def masked_sum(per_sample, mask):
    """float32 scalar ``sum(mask * per_sample)`` over the real slots (``mask > 0``): the numerator of
    :func:`masked_loss`, and the loss column of a step's sums."""
    tf = _tf()
    with tf.control_dependencies(check_per_sample(per_sample, mask)):
        per_sample = tf.identity(tf.cast(per_sample, tf.float32))
    # Padding slots hold real (dummy) rows, so their losses are finite; `where` rather than
    # `mask * loss` still keeps the value exact if a user's map function leaves garbage there.
    return tf.reduce_sum(tf.where(mask > 0, per_sample, tf.zeros_like(per_sample)))


def check_per_sample(per_sample, mask) -> list:
    """Refuse a loss that is not one value per slot: a mean-reduced one would broadcast over the
    slots and count padding. Shapes known when traced are checked then; the returned assertion
    (a list of at most one op, for ``tf.control_dependencies``) checks the rest at run time."""
    tf = _tf()
    per_sample, mask = tf.convert_to_tensor(per_sample), tf.convert_to_tensor(mask)
    got, want = per_sample.shape, mask.shape
    fix = ("with a Keras loss pass reduction=None, e.g. "
           "keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)")
    if got.rank is not None and want.rank is not None and (
            got.rank != want.rank or not got.is_compatible_with(want)):
        raise ValueError(f"the loss must be one value per sample, shape [slots] like the mask, got shape "
                         f"{got}; {fix}")
    if got.is_fully_defined() and want.is_fully_defined():
        return []
    return [tf.debugging.assert_equal(tf.shape(per_sample), tf.shape(mask), message=(
        f"the loss must be one value per sample, the shape of the mask; {fix}"))]
