"""Stateless augmentations keyed by (seed, epoch, sample id).

Each function here returns a map function ``fn(batch) -> batch`` for
:class:`~evenflow.tf.input.reader.PlanReader`. It changes ``batch["features"]``
(``[slots, H, W, C]``) and draws its random numbers as a pure function of
``(seed, epoch, id)``: no random state anywhere. So a sample gets the same augmentation
whatever the number of replicas, whichever replica and slot it lands in, and however
often the run is resumed; a new epoch gives it a new one. Padding slots (id -1) get
the draws of id -1, which the mask then ignores.

Each augmentation has its own stream constant, so two augmentations with the same
seed draw independent numbers.

The per-sample numbers come from :func:`evenflow.tf.input.sample_hash.sample_uniform`, a
counter-based hash computed with vectorised uint64 ops on the whole batch: well under 1 µs
per sample, where ``stateless_fold_in`` + ``stateless_uniform`` once per sample in a
``tf.map_fn`` would cost a large share of decoding, cropping and flipping a 32x32 JPEG.

:func:`parse_policy` and :func:`from_policy` turn a short text such as
``"crop,rotate=15"`` (the ``augment`` key of ``evenflow train``) into one map function.
"""
from __future__ import annotations

import math
from typing import Callable

from evenflow.data.augment_policy import check_fits, default_crop
from evenflow.data.augment_policy import STREAMS as _STREAMS
from evenflow.data.augment_policy import policy_value as _policy_value
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.sample_hash import sample_uniform
from evenflow.util.validate import check_choice, check_int, check_number

MapFn = Callable[[dict], dict]


def _check_seed(seed) -> int:
    return check_int("seed", seed)


def _features(batch: dict, name: str):
    tf = _tf()
    if "features" not in batch or "id" not in batch or "epoch" not in batch:
        raise ValueError(f"{name} needs batch keys 'features', 'id' and 'epoch' (as PlanReader makes them); "
                         f"got {', '.join(sorted(batch))}")
    x = batch["features"]
    if x.shape.rank != 4:
        raise ValueError(f"{name} needs features [slots, H, W, C], got shape {x.shape}")
    return tf, x


def chain(*fns: MapFn) -> MapFn:
    """One map function that applies ``fns`` in order."""
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"chain argument {i} must be a function batch -> batch, got {type(fn).__name__}")

    def fn(batch: dict) -> dict:
        for f in fns:
            batch = f(batch)
        return batch

    return fn


def random_crop(padding: int, seed: int = 0, mode: str = "CONSTANT") -> MapFn:
    """Pad by ``padding`` pixels on every side, then crop back to H x W at a random offset.

    Args:
        padding: pixels, >= 0.
        seed: the run's augmentation seed.
        mode: ``tf.pad`` mode: ``"CONSTANT"`` (zeros), ``"REFLECT"`` or ``"SYMMETRIC"``.
    """
    _check_seed(seed)
    check_int("padding", padding, 0)
    check_choice("mode", mode, ("CONSTANT", "REFLECT", "SYMMETRIC"))

    def fn(batch: dict) -> dict:
        tf, x = _features(batch, "random_crop")
        if padding == 0:
            return batch
        side = min((d for d in x.shape[1:3] if d is not None), default=None)
        if side is not None and padding >= side:
            raise ValueError(f"random_crop padding {padding} on images of {x.shape[1]} x {x.shape[2]} pixels crops "
                             f"some samples to nothing but padding; use a padding of at most {side - 1}")
        shape = tf.shape(x)
        n, h, w, c = shape[0], shape[1], shape[2], shape[3]
        u = sample_uniform(batch, seed, _STREAMS["crop"], 2)
        off = tf.minimum(tf.cast(u * (2 * padding + 1), tf.int32), 2 * padding)  # [slots, 2] in 0..2p
        if mode != "CONSTANT":
            padded = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]], mode=mode)
            out = tf.gather(padded, off[:, :1] + tf.range(h)[None, :], axis=1, batch_dims=1)
            out = tf.gather(out, off[:, 1:] + tf.range(w)[None, :], axis=2, batch_dims=1)
            return {**batch, "features": tf.ensure_shape(out, x.shape)}
        # Zero padding without padding: one gather of source pixels (clipped into the image),
        # times a mask that zeroes the pixels that came from outside. Pad + two gathers cost
        # twice as much: they copy the padded batch, then the batch twice.
        rows = off[:, :1] - padding + tf.range(h)[None, :]                       # [slots, H] source rows
        cols = off[:, 1:] - padding + tf.range(w)[None, :]                       # [slots, W]
        src = (tf.clip_by_value(rows, 0, h - 1)[:, :, None] * w
               + tf.clip_by_value(cols, 0, w - 1)[:, None, :])                   # [slots, H, W]
        inside = (((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :])
        out = tf.gather(tf.reshape(x, [n, h * w, c]), tf.reshape(src, [n, h * w]), batch_dims=1)
        out = tf.reshape(out, shape) * tf.cast(inside, x.dtype)[:, :, :, None]
        return {**batch, "features": tf.ensure_shape(out, x.shape)}

    return fn


def flip(horizontal: bool = True, vertical: bool = False, p: float = 0.5, seed: int = 0) -> MapFn:
    """Mirror each sample left-right and/or up-down with probability ``p`` (independently)."""
    _check_seed(seed)
    check_number("p", p, 0, 1)
    if not (horizontal or vertical):
        raise ValueError("flip needs horizontal=True or vertical=True")

    def fn(batch: dict) -> dict:
        tf, x = _features(batch, "flip")
        u = sample_uniform(batch, seed, _STREAMS["flip"], 2)
        out = x
        if horizontal:
            out = tf.where((u[:, 0] < p)[:, None, None, None], tf.reverse(out, [2]), out)
        if vertical:
            out = tf.where((u[:, 1] < p)[:, None, None, None], tf.reverse(out, [1]), out)
        return {**batch, "features": out}

    return fn


def rotate(max_degrees: float, seed: int = 0, fill_value: float = 0.0, interpolation: str = "BILINEAR") -> MapFn:
    """Rotate each sample about its centre by an angle uniform in ``[-max_degrees, max_degrees]``.

    Uses ``ImageProjectiveTransformV3`` with one transform per sample; pixels from outside
    the image are ``fill_value``.
    """
    _check_seed(seed)
    check_number("max_degrees", max_degrees, 0, 180)
    check_choice("interpolation", interpolation, ("BILINEAR", "NEAREST"))

    def fn(batch: dict) -> dict:
        tf, x = _features(batch, "rotate")
        u = sample_uniform(batch, seed, _STREAMS["rotate"], 1)[:, 0]
        angle = (2.0 * u - 1.0) * (max_degrees * math.pi / 180.0)
        h = tf.cast(tf.shape(x)[1], tf.float32)
        w = tf.cast(tf.shape(x)[2], tf.float32)
        c, s = tf.cos(angle), tf.sin(angle)
        # Output pixel (x, y) samples input (c*x - s*y + dx, s*x + c*y + dy): rotation about the centre.
        dx = ((w - 1) - (c * (w - 1) - s * (h - 1))) / 2.0
        dy = ((h - 1) - (s * (w - 1) + c * (h - 1))) / 2.0
        zeros = tf.zeros_like(c)
        transforms = tf.stack([c, -s, dx, s, c, dy, zeros, zeros], axis=1)
        images = x if x.dtype in (tf.float32, tf.float16, tf.uint8, tf.int32, tf.int64, tf.float64) \
            else tf.cast(x, tf.float32)
        out = tf.raw_ops.ImageProjectiveTransformV3(
            images=images, transforms=transforms, output_shape=tf.shape(x)[1:3],
            fill_value=tf.constant(fill_value, tf.float32), interpolation=interpolation, fill_mode="CONSTANT")
        return {**batch, "features": tf.ensure_shape(tf.cast(out, x.dtype), x.shape)}

    return fn


def brightness(max_delta: float, seed: int = 0) -> MapFn:
    """Add a per-sample delta uniform in ``[-max_delta, max_delta]`` (float features)."""
    _check_seed(seed)
    check_number("max_delta", max_delta, 0)

    def fn(batch: dict) -> dict:
        tf, x = _features(batch, "brightness")
        if not x.dtype.is_floating:
            raise ValueError(f"brightness needs float features, got {x.dtype.name}; decode with scale=True")
        u = sample_uniform(batch, seed, _STREAMS["brightness"], 1)
        delta = tf.cast((2.0 * u - 1.0) * max_delta, x.dtype)[:, :, None, None]
        return {**batch, "features": x + delta}

    return fn


def contrast(lower: float, upper: float, seed: int = 0) -> MapFn:
    """Scale each sample's deviation from its per-channel mean by a factor uniform in [lower, upper]."""
    _check_seed(seed)
    if not 0 <= lower <= upper < math.inf:
        raise ValueError(f"contrast needs 0 <= lower <= upper < inf, got {lower!r}, {upper!r}")

    def fn(batch: dict) -> dict:
        tf, x = _features(batch, "contrast")
        if not x.dtype.is_floating:
            raise ValueError(f"contrast needs float features, got {x.dtype.name}; decode with scale=True")
        u = sample_uniform(batch, seed, _STREAMS["contrast"], 1)
        f = tf.cast(lower + u * (upper - lower), x.dtype)[:, :, None, None]
        mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)
        return {**batch, "features": (x - mean) * f + mean}

    return fn


# -- policies: the ``augment`` key of `evenflow train` (framework-free, shared with evenflow.torch) --------


def from_policy(policy, feature_shape: tuple[int, ...], seed: int = 0) -> MapFn | None:
    """One map function applying ``policy`` to image features of shape ``feature_shape``.

    Args:
        policy: text for :func:`parse_policy`, or its result.
        feature_shape: one sample's features, ``(H, W)`` or ``(H, W, C)``; ``(H, W)``
            features are augmented as one channel and keep their shape.
        seed: the augmentation seed (the run's seed).

    Returns:
        ``fn(batch) -> batch``, or None for an empty policy.

    Raises:
        ValueError: the features are not images (rank 2 or 3, at least 2 x 2 pixels), or a crop padding of
            the image's height or width or more.
    """
    _check_seed(seed)
    items = check_fits(policy, feature_shape)
    if not items:
        return None
    shape = tuple(int(d) for d in feature_shape)
    fns = []
    for name, text in items:
        value = None if text is None else _policy_value(name, text, text)
        if name == "crop":
            fns.append(random_crop(default_crop(shape) if value is None else value, seed=seed))
        elif name == "rotate":
            fns.append(rotate(10.0 if value is None else value, seed=seed))
        elif name == "flip":
            axes = value or "h"
            fns.append(flip(horizontal="h" in axes, vertical="v" in axes, seed=seed))
        elif name == "brightness":
            fns.append(brightness(0.1 if value is None else value, seed=seed))
        else:
            spread = 0.2 if value is None else value
            fns.append(contrast(1.0 - spread, 1.0 + spread, seed=seed))
    body = chain(*fns)
    if len(shape) == 3:
        return body

    def fn(batch: dict) -> dict:
        # [slots, H, W] features: augment them as one channel, hand them back without it.
        tf = _tf()
        out = body({**batch, "features": tf.expand_dims(batch["features"], -1)})
        return {**out, "features": tf.squeeze(out["features"], -1)}

    return fn
