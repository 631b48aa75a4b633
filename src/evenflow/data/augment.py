"""Stateless augmentations in numpy, keyed by (seed, epoch, sample id): for any numpy consumer.

The numpy counterpart of :mod:`evenflow.tf.input.augment`, with the same policy text
(``"crop,rotate=15"``, parsed by :func:`evenflow.data.augment_policy.parse_policy`)
and the same random numbers: a SplitMix64 hash chained over seed, epoch, stream, id and
draw number, here in vectorised numpy uint64 arithmetic. So a sample gets the same crop
offset, flip and angle under both frameworks, whatever the number of ranks, whichever
rank and slot it lands in, and however often the run is resumed. Pixel values may differ
from TensorFlow's in the last bits (rotation interpolates in float32 numpy).

:func:`from_policy` returns an :class:`Augmentation`: a picklable ``fn(batch) -> batch``,
e.g. for :class:`~evenflow.torch.loader.PlanLoader`'s ``transform`` (run in its workers,
on training batches only, never evaluation). It changes ``batch["features"]``
(``[slots, H, W]`` or ``[slots, H, W, C]``, float) using ``batch["id"]`` (-1 for padding,
which the mask ignores) and ``batch["epoch"]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evenflow.data.augment_policy import POLICY_HELP, STREAMS, check_fits, default_crop, policy_value
from evenflow.util.validate import check_int

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return x ^ (x >> _S31)


def _combine(h: np.ndarray, value) -> np.ndarray:
    v = np.asarray(value, np.int64).view(np.uint64)
    return _mix64((h ^ v) + _GOLDEN)


def sample_uniform(ids, epoch: int, seed: int, stream: int, count: int) -> np.ndarray:
    """float32 ``[slots, count]`` uniform in [0, 1): a pure function of (seed, epoch, stream, id, draw).

    The numbers of :func:`evenflow.tf.input.augment.sample_uniform` for the same arguments.
    """
    with np.errstate(over="ignore"):
        h = _combine(np.full(1, _GOLDEN), np.array([seed], np.int64))
        h = _combine(h, np.array([epoch], np.int64))
        h = _combine(h, np.array([stream], np.int64))
        h = _combine(h, np.asarray(ids, np.int64).reshape(-1))                      # [slots]
        v = _combine(h[:, None], np.arange(1, count + 1, dtype=np.int64)[None, :])  # [slots, count]
    return (v >> _S40).astype(np.float32) * np.float32(1.0 / (1 << 24))


def _crop(x, u, padding: int):
    if padding == 0:
        return x
    n, h, w = x.shape[:3]
    padded = np.pad(x, [(0, 0), (padding, padding), (padding, padding), (0, 0)])
    off = np.minimum((u * (2 * padding + 1)).astype(np.int64), 2 * padding)  # [slots, 2] in 0..2p
    rows = off[:, :1] + np.arange(h)[None, :]
    cols = off[:, 1:] + np.arange(w)[None, :]
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def _flip(x, u, axes: str, p: float = 0.5):
    out = x
    if "h" in axes:
        out = np.where((u[:, 0] < p)[:, None, None, None], out[:, :, ::-1], out)
    if "v" in axes:
        out = np.where((u[:, 1] < p)[:, None, None, None], out[:, ::-1], out)
    return out


def _rotate(x, u, max_degrees: float):
    """Bilinear rotation about the centre, zeros from outside: TensorFlow's ImageProjectiveTransformV3 rule."""
    n, h, w, c = x.shape
    angle = (2.0 * u[:, 0].astype(np.float64) - 1.0) * (max_degrees * math.pi / 180.0)
    cs, sn = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    dx = ((w - 1) - (cs * (w - 1) - sn * (h - 1))) / 2.0
    dy = ((h - 1) - (sn * (w - 1) + cs * (h - 1))) / 2.0
    yy, xx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    src_x = cs * xx - sn * yy + dx                                              # [slots, H, W]
    src_y = sn * xx + cs * yy + dy
    x0, y0 = np.floor(src_x).astype(np.int64), np.floor(src_y).astype(np.int64)
    fx, fy = (src_x - x0)[..., None], (src_y - y0)[..., None]
    b = np.arange(n)[:, None, None]

    def at(yi, xi):
        inside = ((yi >= 0) & (yi < h) & (xi >= 0) & (xi < w))[..., None]
        return np.where(inside, x[b, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)], 0)

    out = ((1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x0 + 1))
           + fy * ((1 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1)))
    return out.astype(x.dtype, copy=False)


def _brightness(x, u, max_delta: float):
    return x + ((2.0 * u - 1.0) * max_delta).astype(x.dtype)[:, :, None, None]


def _contrast(x, u, spread: float):
    f = (1.0 - spread + u * (2 * spread)).astype(x.dtype)[:, :, None, None]
    mean = x.mean(axis=(1, 2), keepdims=True)
    return (x - mean) * f + mean


_DEFAULTS = {"rotate": 10.0, "brightness": 0.1, "contrast": 0.2, "flip": "h"}
_DRAWS = {"crop": 2, "flip": 2, "rotate": 1, "brightness": 1, "contrast": 1}


@dataclass(frozen=True)
class Augmentation:
    """A picklable ``fn(batch) -> batch`` applying ``steps`` to ``batch["features"]`` (numpy).

    Args:
        steps: ``((name, value), ...)`` with values resolved (pixels, degrees, axes, deltas).
        seed: the run's augmentation seed.
        squeeze: the features are ``[slots, H, W]``: augmented as one channel, returned without it.
    """

    steps: tuple
    seed: int
    squeeze: bool = False

    def __call__(self, batch: dict) -> dict:
        if "features" not in batch or "id" not in batch or "epoch" not in batch:
            raise ValueError(f"augmentation needs batch keys 'features', 'id' and 'epoch' (as the plan "
                             f"readers make them); got {', '.join(sorted(batch))}")
        x = np.asarray(batch["features"])
        if x.dtype.kind != "f":
            x = x.astype(np.float32)
        x = x[..., None] if self.squeeze else x
        ids, epoch = batch["id"], int(batch["epoch"])
        for name, value in self.steps:
            u = sample_uniform(ids, epoch, self.seed, STREAMS[name], _DRAWS[name])
            if name == "crop":
                x = _crop(x, u, value)
            elif name == "flip":
                x = _flip(x, u, value)
            elif name == "rotate":
                x = _rotate(x, u, value)
            elif name == "brightness":
                x = _brightness(x, u, value)
            else:
                x = _contrast(x, u, value)
        return {**batch, "features": np.ascontiguousarray(x[..., 0] if self.squeeze else x)}


def from_policy(policy, feature_shape: tuple[int, ...], seed: int = 0) -> Augmentation | None:
    """The :class:`Augmentation` for ``policy`` on features of shape ``feature_shape``, or None for none.

    Args:
        policy: text for :func:`~evenflow.data.augment_policy.parse_policy` (e.g.
            ``"crop,rotate=15"``), or its result.
        feature_shape: one sample's features, ``(H, W)`` or ``(H, W, C)``.
        seed: the augmentation seed (the run's seed).

    Raises:
        ValueError: the features are not images (rank 2 or 3, at least 2 x 2 pixels), a crop padding of the
            image's height or width or more, or a bad policy.
    """
    check_int("seed", seed)
    items = check_fits(policy, feature_shape)
    if not items:
        return None
    shape = tuple(int(d) for d in feature_shape)
    steps = []
    for name, text in items:
        if name not in STREAMS:
            raise ValueError(f"augment {name!r} has no numpy augmentation; use {POLICY_HELP}")
        value = None if text is None else policy_value(name, text, text)
        if value is None:
            value = default_crop(shape) if name == "crop" else _DEFAULTS[name]
        steps.append((name, value))
    return Augmentation(tuple(steps), seed, squeeze=len(shape) == 2)
