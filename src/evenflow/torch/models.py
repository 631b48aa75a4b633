"""Small classifiers chosen by name, the PyTorch twins of :mod:`evenflow.tf.models`.

``packed_text_cnn`` (:mod:`evenflow.torch.text`) reads the rows of a packed plan; it is built
through the API only (``evenflow train`` does not pack). ``mlp`` flattens any input (two hidden
layers of 128); ``cnn`` takes ``[H, W]`` or
channels-last ``[H, W, C]`` images and is built from depthwise-separable
convolutions (a depthwise 3x3 filter per channel, then a 1x1 pointwise mix), the
same layer plan as the TensorFlow model. The weights are initialised by PyTorch,
so the two frameworks start from different weights.
"""
from __future__ import annotations

from typing import Callable

from evenflow.run.options import ModelOptions
from evenflow.torch._lazy import torch as _torch
from evenflow.torch.text import packed_text_cnn
from evenflow.util.validate import check_choice, check_int

_NEEDS = {"cnn": (2, 3)}  # accepted ranks of one sample's features; absent = any rank


def _dropout(nn, rate: float) -> list:
    return [nn.Dropout(rate)] if rate > 0 else []


def _mlp(input_shape, num_classes, *, dropout: float, hidden: int = 128):
    nn = _torch().nn
    size = 1
    for d in input_shape:
        size *= int(d)
    return nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         *_dropout(nn, dropout), nn.Linear(hidden, num_classes))


def _separable(nn, cin, cout, stride=1):
    return [nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin), nn.Conv2d(cin, cout, 1), nn.ReLU()]


def _cnn(input_shape, num_classes, *, dropout: float, width: int = 32):
    torch = _torch()
    nn = torch.nn
    channels = int(input_shape[2]) if len(input_shape) == 3 else 1

    class ChannelsFirst(nn.Module):
        def forward(self, x):  # [B, H, W] or [B, H, W, C] -> [B, C, H, W]
            return x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)

    return nn.Sequential(
        ChannelsFirst(),
        # A plain depthwise first layer: with 1-3 input channels a pointwise half would be nearly all the work.
        nn.Conv2d(channels, 8 * channels, 3, padding=1, groups=channels), nn.ReLU(),
        *_separable(nn, 8 * channels, width),
        *_separable(nn, width, 2 * width, stride=2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), *_dropout(nn, dropout), nn.Linear(2 * width, num_classes))


def _packed(input_shape, num_classes, *, dropout: float, vocab_size: int = 257):
    if dropout:
        raise ValueError(f"model 'packed_text_cnn' has no dropout, got dropout {dropout}")
    return packed_text_cnn(num_classes, vocab_size=vocab_size)


# The models of `build_model` (and the `model` key of a run) by name.
MODELS: dict[str, Callable] = {"cnn": _cnn, "mlp": _mlp, "packed_text_cnn": _packed}


def check_model_input(name: str, input_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` if model ``name`` is unknown or cannot take ``input_shape`` (no torch needed)."""
    check_choice("model", name, MODELS)
    if name == "packed_text_cnn" and len(input_shape) != 1:
        raise ValueError(f"model 'packed_text_cnn' needs token sequences (per-sample shape (length,)), got "
                         f"{tuple(input_shape)}")
    ranks = _NEEDS.get(name)
    if ranks and len(input_shape) not in ranks:
        raise ValueError(f"model {name!r} needs image-shaped features [H, W] or [H, W, C], got per-sample shape "
                         f"{tuple(input_shape)}; reshape the features or use model 'mlp'")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, dropout: float = ModelOptions.dropout,
                vocab_size: int | None = None):
    """A ``torch.nn.Module`` mapping ``[batch, *input_shape]`` float32 to logits ``[batch, num_classes]``.

    ``dropout``: rate of a dropout layer before the logits (0: none). ``packed_text_cnn`` (token
    sequences, ``vocab_size`` default 257) is called as ``model(features, segment_ids, slots)`` on the
    batches of a packed plan and returns ``[slots, num_classes]``; :class:`~evenflow.torch.Trainer`
    calls it so.
    """
    check_model_input(name, input_shape)
    num_classes = check_int("num_classes", num_classes, 2)
    extra = {"vocab_size": int(vocab_size)} if name == "packed_text_cnn" and vocab_size is not None else {}
    return MODELS[name](tuple(input_shape), int(num_classes), dropout=float(dropout), **extra)


# The optimizers of `make_optimizer` (and the `optimizer` key of a run) by name.
OPTIMIZERS: dict[str, Callable] = {
    "adam": lambda torch, params, lr: torch.optim.Adam(params, lr=lr),
    "sgd": lambda torch, params, lr: torch.optim.SGD(params, lr=lr),
}


def make_optimizer(name: str, params, learning_rate: float):
    """A ``torch.optim`` optimizer by name (``adam`` or ``sgd``)."""
    check_choice("optimizer", name, OPTIMIZERS)
    return OPTIMIZERS[name](_torch(), params, float(learning_rate))
