"""The models evenflow builds by name, as the run sees them: names and the inputs each can take.

Every framework adapter builds the same names (``mlp`` for any input, ``cnn`` for images,
``text_cnn`` for token sequences) or refuses one it does not have. The checks are pure
Python, so a run fails on a wrong model before a framework starts.
"""
from __future__ import annotations

from evenflow.run.options import MODEL_NAMES

__all__ = ["MODEL_NAMES", "check_model_input"]

_NEEDS = {"cnn": (2, 3), "text_cnn": (1,)}  # accepted ranks of one sample's features; absent = any rank


def check_model_input(name: str, input_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` if model ``name`` is unknown or cannot take ``input_shape``.

    Pure Python, so it can run before a framework starts.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"model must be one of {', '.join(sorted(MODEL_NAMES))}, got {name!r}")
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
