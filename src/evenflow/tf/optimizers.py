"""Optimizers by name, with dynamic loss scaling under ``mixed_float16``."""
from __future__ import annotations

from typing import Callable

from evenflow.tf._lazy import keras as _keras

__all__ = ["OPTIMIZERS", "make_optimizer"]

OPTIMIZERS: dict[str, Callable] = {
    "adam": lambda keras, lr: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda keras, lr: keras.optimizers.SGD(learning_rate=lr),
}


def make_optimizer(name: str, learning_rate: float, precision: str = "float32"):
    """A Keras optimizer by name; wrapped for dynamic loss scaling under ``mixed_float16``.

    Call it inside ``strategy.scope()``: the optimizer remembers the strategy it was
    created under and all-reduces gradients through it.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(sorted(OPTIMIZERS))}, got {name!r}")
    keras = _keras()
    opt = OPTIMIZERS[name](keras, float(learning_rate))
    if precision == "mixed_float16":
        # float16 gradients underflow without loss scaling; bfloat16 has float32's range and needs none.
        opt = keras.optimizers.LossScaleOptimizer(opt)
    return opt
