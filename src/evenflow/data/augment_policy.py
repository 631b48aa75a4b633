"""Augmentation policies: the text of ``evenflow train --augment`` and the random streams, framework-free.

:func:`parse_policy` checks a short text such as ``"crop,rotate=15"`` in pure Python, so a
bad policy exits 2 before any framework starts. Both :mod:`evenflow.tf.input.augment` and
:mod:`evenflow.data.augment` (numpy) build their functions from its result and draw each
augmentation's numbers from its own stream constant (:data:`STREAMS`), which is what
makes their draws the same for the same (seed, epoch, sample id).

Every value that would leave the images meaningless is refused: a non-finite number, a
rotation past 180 degrees, a brightness delta past :data:`MAX_BRIGHTNESS`, a contrast spread
past 1 (a factor of 0 flattens an image), and — once the image size is known,
in :func:`check_fits` — a crop padding of the image's height or width or more, which
crops some samples to nothing but padding.
"""
from __future__ import annotations

import math

# One stream constant per augmentation: two augmentations with the same seed draw independent numbers.
STREAMS = {"crop": 1, "flip": 2, "rotate": 3, "brightness": 4, "contrast": 5}

POLICY_NAMES: tuple[str, ...] = ("brightness", "contrast", "crop", "flip", "rotate")
POLICY_HELP = ("crop[=PIXELS] (pad and crop back; default H/8, less than the image's height and width), "
               "rotate[=DEGREES] (default 10, at most 180), flip[=h|v|hv] (default h), brightness[=DELTA] "
               "(default 0.1, at most 255), contrast[=SPREAD] (default 0.2, at most 1)")

# The largest brightness delta: the whole range of 8-bit pixel values (images evenflow decodes are in [0, 1]).
MAX_BRIGHTNESS = 255.0


def parse_policy(text: str) -> tuple[tuple[str, str | None], ...]:
    """Parse an augmentation policy such as ``"crop,rotate=15"`` (pure Python, no TensorFlow).

    ``"none"`` (or an empty string) is no augmentation. Otherwise a comma list of
    ``crop[=PIXELS]``, ``rotate[=DEGREES]``, ``flip[=h|v|hv]``, ``brightness[=DELTA]``
    and ``contrast[=SPREAD]``, applied in the order given.

    Returns:
        ``((name, value or None), ...)``, values still as text but checked.

    Raises:
        ValueError: an unknown name, a repeated one, or a value out of range.
    """
    if not isinstance(text, str):
        raise TypeError(f"augment must be a string such as 'crop,rotate', got {type(text).__name__}")
    if text.strip().lower() in ("", "none"):
        return ()
    out: list[tuple[str, str | None]] = []
    for item in text.split(","):
        name, _, value = item.strip().partition("=")
        name, value = name.strip().lower(), (value.strip() or None)
        if name not in POLICY_NAMES:
            raise ValueError(f"augment must be 'none' or a comma list of {POLICY_HELP}; got {name!r} in {text!r}")
        if any(n == name for n, _ in out):
            raise ValueError(f"augment names {name!r} twice in {text!r}; give each augmentation once")
        if value is not None:
            policy_value(name, value, text)
        out.append((name, value))
    return tuple(out)


def policy_value(name: str, value: str, text: str):
    if name == "flip":
        if value.lower() not in ("h", "v", "hv", "vh"):
            raise ValueError(f"augment flip must be flip, flip=h, flip=v or flip=hv, got flip={value} in {text!r}")
        return value.lower()
    try:
        number = int(value) if name == "crop" else float(value)
    except ValueError:
        kind = "an integer number of pixels" if name == "crop" else "a number"
        raise ValueError(f"augment {name} takes {kind}, got {name}={value} in {text!r}") from None
    limits = {"crop": (0, None), "rotate": (0.0, 180.0), "brightness": (0.0, MAX_BRIGHTNESS), "contrast": (0.0, 1.0)}
    low, high = limits[name]
    if not (math.isfinite(number) and number >= low and (high is None or number <= high)):
        bound = f"a number in [{low:g}, {high:g}]" if high is not None else f"an integer >= {low}"
        raise ValueError(f"augment {name} must be {bound}, got {name}={value} in {text!r}")
    return number


def default_crop(feature_shape) -> int:
    """The crop padding of ``crop`` without a value: an eighth of the smaller image side, at least 1."""
    return max(1, round(min(int(d) for d in tuple(feature_shape)[:2]) / 8))


def crop_limit(feature_shape) -> int:
    """The largest crop padding for images of ``feature_shape``: one pixel less than the smaller side.

    A padding of the height or width or more crops some samples to nothing but padding.
    """
    return min(int(d) for d in tuple(feature_shape)[:2]) - 1


def check_fits(policy, feature_shape) -> tuple[tuple[str, str | None], ...]:
    """The parsed ``policy``, after checking the features are images it can augment.

    Raises:
        ValueError: a non-empty policy on features that are not images (rank 2 or 3, at least
            2 x 2 pixels), naming the policy and the shape; a crop padding of the image's height or
            width or more, naming the largest that fits.
    """
    items = parse_policy(policy) if isinstance(policy, str) else tuple(policy)
    shape = tuple(None if d is None else int(d) for d in feature_shape)  # None: variable-length text
    if items and (len(shape) not in (2, 3) or None in shape or min(shape[:2]) < 2):
        raise ValueError(f"augment {', '.join(n for n, _ in items)} needs image features [H, W] or [H, W, C] of at "
                         f"least 2 x 2 pixels, got feature shape {shape}; use augment = 'none' for other data")
    for name, value in items:
        if name == "crop" and value is not None and policy_value(name, value, value) > crop_limit(shape):
            h, w = shape[:2]
            raise ValueError(f"--augment crop={value}: a crop padding of {value} pixels on {h} x {w} images crops "
                             f"some samples to nothing but padding (blank images); the padding must be less than the "
                             f"image's height and width: at most crop={crop_limit(shape)} (default "
                             f"crop={default_crop(shape)})")
    return items
