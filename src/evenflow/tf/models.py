"""Small classifiers chosen by name: ``mlp`` for any input, ``cnn`` for images, ``text_cnn`` for
variable-length token sequences (:mod:`evenflow.tf.text`).

``cnn`` is built from depthwise-separable convolutions (a depthwise 3x3 filter per
channel followed by a 1x1 pointwise mix), which need roughly 8-9x fewer
multiply-adds and weights than full 3x3 convolutions of the same width — the
"lighter model" that makes data parallelism cheaper to communicate.

Every model ends in a float32 logits layer, so losses stay in float32 under the
mixed-precision policies (the computation in between runs in float16/bfloat16).
"""
from __future__ import annotations

from typing import Callable

from evenflow.tf._lazy import keras as _keras
from evenflow.tf.text import text_cnn

__all__ = ["MODELS", "build_model", "check_model_input"]


def _mlp(input_shape, num_classes, dtype, hidden: int = 128):
    keras = _keras()
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Flatten(dtype=dtype),
        layers.Dense(hidden, activation="relu", dtype=dtype),
        layers.Dense(hidden, activation="relu", dtype=dtype),
        layers.Dense(num_classes, dtype="float32", name="logits"),
    ], name="mlp")


def _cnn(input_shape, num_classes, dtype, width: int = 32):
    keras = _keras()
    layers = keras.layers
    stack = [keras.Input(shape=input_shape)]
    if len(input_shape) == 2:  # [H, W] grey images: add the channel axis
        stack.append(layers.Reshape((*input_shape, 1), dtype=dtype))
    stack += [
        # The first layer is a plain depthwise filter: with 1-3 input channels a separable
        # layer's pointwise half would be nearly all of the work anyway.
        layers.DepthwiseConv2D(3, padding="same", depth_multiplier=8, activation="relu", dtype=dtype),
        layers.SeparableConv2D(width, 3, padding="same", activation="relu", dtype=dtype),
        layers.SeparableConv2D(2 * width, 3, padding="same", strides=2, activation="relu", dtype=dtype),
        layers.GlobalAveragePooling2D(dtype=dtype),
        layers.Dense(num_classes, dtype="float32", name="logits"),
    ]
    return keras.Sequential(stack, name="cnn")


MODELS: dict[str, Callable] = {"cnn": _cnn, "mlp": _mlp, "text_cnn": text_cnn}

_NEEDS = {"cnn": (2, 3), "text_cnn": (1,)}  # accepted ranks of one sample's features; absent = any rank


def check_model_input(name: str, input_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` if model ``name`` is unknown or cannot take ``input_shape``.

    Pure Python, so it can run before TensorFlow starts.
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(sorted(MODELS))}, got {name!r}")
    if name == "text_cnn" and len(input_shape) != 1:
        raise ValueError(f"model 'text_cnn' needs token sequences (per-sample shape (length,)), got "
                         f"{tuple(input_shape)}; use it with a text dataset such as builtin:stdlib-docs")
    if name != "text_cnn" and None in tuple(input_shape):
        raise ValueError(f"model {name!r} needs fixed-size features, but this dataset's sequences vary in length "
                         f"(per-sample shape {tuple(input_shape)}); use model 'text_cnn'")
    ranks = _NEEDS.get(name)
    if ranks and len(input_shape) not in ranks:
        raise ValueError(
            f"model {name!r} needs image-shaped features [H, W] or [H, W, C], got per-sample shape "
            f"{tuple(input_shape)}; reshape the features or use model 'mlp'")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, precision: str = "float32"):
    """Build (not compile) model ``name``; call it inside ``strategy.scope()``.

    Args:
        name: a key of :data:`MODELS`.
        input_shape: shape of one sample's features, e.g. ``(8, 8, 1)``.
        num_classes: number of output logits, >= 2.
        precision: a Keras dtype policy name: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.

    Returns:
        A ``keras.Model`` mapping ``[batch, *input_shape]`` to float32 logits ``[batch, num_classes]``.
    """
    check_model_input(name, input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    keras = _keras()
    return MODELS[name](tuple(input_shape), int(num_classes), keras.DTypePolicy(precision))
