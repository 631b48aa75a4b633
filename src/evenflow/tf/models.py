"""Small classifiers chosen by name: ``mlp`` for any input, ``cnn`` for images, ``text_cnn`` for
variable-length token sequences (:mod:`evenflow.tf.input.text`).

``cnn`` is built from depthwise-separable convolutions (a depthwise 3x3 filter per
channel followed by a 1x1 pointwise mix), which need roughly 8-9x fewer
multiply-adds and weights than full 3x3 convolutions of the same width — the
"lighter model" that makes data parallelism cheaper to communicate.

Every model ends in a float32 logits layer, so losses stay in float32 under the
mixed-precision policies (the computation in between runs in float16/bfloat16).
"""
from __future__ import annotations

from typing import Callable

from evenflow.run.models import check_model_input
from evenflow.run.options import ComputeOptions, ModelOptions
from evenflow.tf._lazy import keras as _keras
from evenflow.tf.input.packed import packed_text_cnn
from evenflow.tf.input.text import text_cnn
from evenflow.util.validate import check_int


def _dropout(layers, rate: float, dtype) -> list:
    return [layers.Dropout(rate, dtype=dtype)] if rate > 0 else []


def _mlp(input_shape, num_classes, dtype, *, dropout: float, hidden: int = 128):
    keras = _keras()
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Flatten(dtype=dtype),
        layers.Dense(hidden, activation="relu", dtype=dtype),
        layers.Dense(hidden, activation="relu", dtype=dtype),
        *_dropout(layers, dropout, dtype),
        layers.Dense(num_classes, dtype="float32", name="logits"),
    ], name="mlp")


def _cnn(input_shape, num_classes, dtype, *, dropout: float, width: int = 32):
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
        *_dropout(layers, dropout, dtype),
        layers.Dense(num_classes, dtype="float32", name="logits"),
    ]
    return keras.Sequential(stack, name="cnn")


def _packed(input_shape, num_classes, dtype, *, dropout: float, vocab_size: int = 257):
    if len(tuple(input_shape)) != 1:
        raise ValueError(f"model 'packed_text_cnn' needs token sequences (per-sample shape (length,)), got "
                         f"{tuple(input_shape)}")
    if dropout or dtype.name != "float32":
        raise ValueError(f"model 'packed_text_cnn' has no dropout and runs in float32; got dropout {dropout} and "
                         f"precision {dtype.name!r}")
    return packed_text_cnn(num_classes, vocab_size=vocab_size)


# The models of `build_model` (and the `model` key of a run) by name.
MODELS: dict[str, Callable] = {"cnn": _cnn, "mlp": _mlp, "text_cnn": text_cnn, "packed_text_cnn": _packed}
# Built through the API only (it reads packed batches: evenflow.tf.packed_dataset); evenflow train has no packing.
API_ONLY = ("packed_text_cnn",)

def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                precision: str = ComputeOptions.precision, dropout: float = ModelOptions.dropout,
                vocab_size: int | None = None):
    """Build (not compile) model ``name``; call it inside ``strategy.scope()``.

    Args:
        name: a key of :data:`MODELS`.
        input_shape: shape of one sample's features, e.g. ``(8, 8, 1)``.
        num_classes: number of output logits, >= 2.
        precision: a Keras dtype policy name: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        dropout: rate of a dropout layer before the logits (0: none).
        vocab_size: ``text_cnn`` and ``packed_text_cnn`` only: token ids are below it (default
            257, byte text; :attr:`evenflow.data.LoadedData.vocab_size`).

    Returns:
        A ``keras.Model`` mapping ``[batch, *input_shape]`` to float32 logits ``[batch, num_classes]``;
        ``packed_text_cnn`` is called as ``model((features, segment_ids), slots=n)`` on the batches of a
        packed plan (:func:`evenflow.tf.packed_dataset`) and returns ``[slots, num_classes]``.
    """
    if name not in API_ONLY:
        check_model_input(name, input_shape)
    num_classes = check_int("num_classes", num_classes, 2)
    keras = _keras()
    extra = {"vocab_size": int(vocab_size)} if name in ("text_cnn", *API_ONLY) and vocab_size is not None else {}
    return MODELS[name](tuple(input_shape), int(num_classes), keras.DTypePolicy(precision), dropout=float(dropout),
                        **extra)
