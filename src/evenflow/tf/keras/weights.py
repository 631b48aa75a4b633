"""Per-sample weights for ``evenflow.tf.fit``: ``class_weight`` and ``sample_weight`` as ``model.fit`` takes them.

Keras turns ``class_weight`` into one weight per sample (the weight of its label; 1.0 for a
label the dict does not name), takes ``sample_weight`` as one weight per sample aligned with
``x``, refuses both at once, and weights the loss per sample: with its default reduction a
batch's loss is ``sum(w * loss) / batch_size``. :func:`sample_weights` makes the same array
``[N]``; the plan reads it by sample id, like the labels, and the exact steps multiply each
real row's weight into the loss (so a step's loss is ``sum(w * loss)`` over its real samples
divided by their count, what one device's ``model.fit`` computes on them) and hand it to the
compiled ``weighted_metrics``. As in ``model.fit``, ``class_weight`` weights training only;
``sample_weight`` is split with ``validation_split`` and weights ``val_loss`` too.
"""
from __future__ import annotations

import numbers

import numpy as np

from evenflow.tf._lazy import tf as _tf


def _labels_of(source) -> np.ndarray | None:
    """One integer class per sample, as Keras reads ``y`` for ``class_weight``; None if ``y`` has none."""
    inner = getattr(source, "source", source)
    y = getattr(inner, "_y", None)
    if y is None:  # a source of its own: the index's labels
        return source.index().labels
    leaves = _tf().nest.flatten(y)
    if len(leaves) != 1:
        return None
    a = np.asarray(leaves[0])
    if a.ndim == 2:
        a = a[:, 0] if a.shape[1] == 1 else np.argmax(a, axis=-1)
    if a.ndim != 1:
        return None
    labels = np.round(a).astype(np.int64)
    ids = getattr(source, "ids", None)
    return labels if ids is None else labels[ids]


def _class_weights(source, class_weight) -> np.ndarray:
    if not isinstance(class_weight, dict) or not all(
            isinstance(k, numbers.Integral) and isinstance(v, numbers.Real) and not isinstance(v, bool)
            for k, v in class_weight.items()):
        raise ValueError(f"class_weight must be a dict of class index -> weight (e.g. {{0: 1.0, 1: 5.0}}), got "
                         f"{class_weight!r}")
    labels = _labels_of(source)
    if labels is None:
        raise ValueError("class_weight needs one class label per sample: y as class ids [N], [N, 1] or one-hot "
                         "[N, classes] for a model of one output (or a source whose index has labels); pass "
                         "sample_weight= instead")
    table = {int(k): float(v) for k, v in class_weight.items()}
    return np.array([table.get(int(c), 1.0) for c in labels], np.float32)


def given_weights(sample_weight, n: int, what: str) -> np.ndarray:
    """``sample_weight`` checked as one finite weight >= 0 for each of ``n`` samples (``what`` names it)."""
    w = np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != n or w.dtype.kind not in "iuf":
        raise ValueError(f"{what} must be one number per sample of x, an array of shape ({n},), got "
                         f"{w.dtype} of shape {w.shape}; pass one weight per sample")
    if not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"{what} must hold finite weights >= 0; found {w[~(np.isfinite(w) & (w >= 0))][0]!r}")
    return w.astype(np.float32)


def sample_weights(source, class_weight, sample_weight) -> np.ndarray | None:
    """The per-sample training weights ``[N]`` of ``source`` (all of ``x``, before any split), or None.

    Raises:
        ValueError: both given (as ``model.fit`` refuses), a ``class_weight`` that is not a dict
            of class -> weight or without labels to read, or a ``sample_weight`` not of shape ``[N]``.
    """
    if class_weight is not None and sample_weight is not None:
        raise ValueError("pass class_weight or sample_weight, not both (as model.fit): fold the class weights "
                         "into sample_weight")
    if class_weight is not None:
        return _class_weights(source, class_weight)
    if sample_weight is not None:
        return given_weights(sample_weight, source.num_samples, "sample_weight")
    return None

