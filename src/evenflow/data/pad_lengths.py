"""Pad lengths: how wide a batch of variable-length sequences is padded.

A batch is padded to its longest sequence, or, with ``pad_lengths`` (``--pad-lengths``), to
the smallest listed length that holds it, for users who want a small, fixed set of shapes
(XLA, TPUs). Shared by text (:mod:`evenflow.data.text`) and variable-length list features
(:mod:`evenflow.data.sequences`). Pure Python and numpy.
"""
from __future__ import annotations

import numpy as np


def parse_pad_lengths(value) -> tuple[int, ...] | None:
    """The ``pad_lengths`` config value as a tuple, or None for ``""`` (pad to each batch's longest).

    Args:
        value: a comma list such as ``"64,128,256,512"`` (the flag), or a list of ints
            (a TOML array).

    Raises:
        ValueError: not increasing positive integers; the message names the bad item.
    """
    rule = "pad_lengths must be a comma list of increasing positive integers (tokens), e.g. 64,128,256,512"
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",")] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"{rule}; got {type(value).__name__} {value!r}")
    if not items:
        return None
    lengths = []
    for x in items:
        if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, str) and x.lstrip("+-").isdigit())):
            raise ValueError(f"{rule}; got {value!r}, where {x!r} is not an integer")
        if int(x) < 1:
            raise ValueError(f"{rule}; got {value!r}, where {int(x)} is not positive")
        lengths.append(int(x))
    for a, b in zip(lengths, lengths[1:]):
        if b <= a:
            raise ValueError(f"{rule}; got {value!r}, where {b} follows {a}: sort them and drop repeats")
    return tuple(lengths)


def pad_lengths_of(options) -> tuple[int, ...] | None:
    """The parsed ``pad_lengths`` of data options (any object; None when it has none or it is empty)."""
    return parse_pad_lengths(getattr(options, "pad_lengths", "") or "")


def check_pad_lengths(pad_lengths, longest: int) -> tuple[int, ...] | None:
    """``pad_lengths`` as a tuple of ints, checked: increasing, positive, the last >= ``longest``.

    Args:
        pad_lengths: lengths in tokens, or None (pad each batch to its longest sequence).
        longest: tokens of the dataset's longest sequence.

    Raises:
        ValueError: not increasing positive lengths, or the last one shorter than ``longest``.
    """
    if pad_lengths is None:
        return None
    pad_lengths = tuple(int(x) for x in pad_lengths)
    if not pad_lengths or any(b <= a for a, b in zip(pad_lengths, pad_lengths[1:])) or pad_lengths[0] < 1:
        raise ValueError(f"pad_lengths must be increasing positive lengths, got {pad_lengths}")
    if pad_lengths[-1] < longest:
        raise ValueError(f"pad_lengths must reach the longest sequence ({longest} tokens), but the last is "
                         f"{pad_lengths[-1]}; append {longest} or more")
    return pad_lengths


def padded_length(lengths: np.ndarray, pad_lengths: tuple[int, ...] | None) -> int:
    """Width of a batch of sequences of ``lengths`` tokens: the longest, or the smallest pad length that holds it."""
    longest = int(np.max(lengths)) if len(lengths) else 0
    if pad_lengths is None:
        return longest
    return next(n for n in pad_lengths if n >= longest)
