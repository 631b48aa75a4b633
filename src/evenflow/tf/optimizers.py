"""Optimizers by name, with dynamic loss scaling under ``mixed_float16``, and the switch for gradients summed already."""
from __future__ import annotations

from typing import Callable

from evenflow.run.options import ComputeOptions
from evenflow.tf._lazy import keras as _keras
from evenflow.util.validate import check_choice

# The optimizers of `make_optimizer` (and the `optimizer` key of a run) by name.
OPTIMIZERS: dict[str, Callable] = {
    "adam": lambda keras, lr: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda keras, lr: keras.optimizers.SGD(learning_rate=lr),
}


def make_optimizer(name: str, learning_rate: float, precision: str = ComputeOptions.precision):
    """A Keras optimizer by name; wrapped for dynamic loss scaling under ``mixed_float16``.

    Call it inside ``strategy.scope()``: the optimizer remembers the strategy it was
    created under and all-reduces gradients through it.
    """
    check_choice("optimizer", name, OPTIMIZERS)
    keras = _keras()
    opt = OPTIMIZERS[name](keras, float(learning_rate))
    if precision == "mixed_float16":
        # float16 gradients underflow without loss scaling; bfloat16 has float32's range and needs none.
        opt = keras.optimizers.LossScaleOptimizer(opt)
    return opt


def presum_gradients(optimizer, presummed: bool) -> None:
    """Tell a Keras 3 optimizer whether the gradients it gets are already summed over replicas.

    Keras's TensorFlow optimizer sums gradients over replicas itself
    (``TFOptimizer._all_reduce_sum_gradients``) when ``apply`` runs in replica context. A trainer
    that all-reduces them itself (compressed) switches that off, or the sum would be taken twice;
    a ``LossScaleOptimizer`` delegates to its inner optimizer, so that is the one changed. The
    change stays with the optimizer, so an optimizer switched off is refused where its own sum is
    needed (``presummed`` False), instead of silently applying one replica's gradients.
    """
    target = getattr(optimizer, "inner_optimizer", optimizer)
    if not presummed:
        if getattr(target, "_evenflow_presummed", False):
            raise ValueError("this optimizer was given to a Trainer with gradient compression, which switched off "
                             "its own sum over replicas; create a new optimizer for a trainer without compression")
        return
    if not callable(getattr(target, "_all_reduce_sum_gradients", None)):
        raise TypeError(f"gradient compression needs a Keras 3 TensorFlow optimizer (with "
                        f"_all_reduce_sum_gradients), got {type(target).__name__}; use compression='none'")
    target._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    target._evenflow_presummed = True
