"""Measured replica speeds, and when to re-plan the rest of an epoch with them.

Framework-free: a trainer feeds :class:`SpeedEstimator` what each replica did
(its load — real samples, or summed cost — and the seconds its computation took),
and asks :class:`Rebalancer` whether the plan's weights should change.

The model: replica r needs ``u_r`` seconds per unit of load, so under shares
``p`` (summing to 1) of a step's load ``L`` it takes ``L * p_r * u_r`` and the step
takes the slowest of those. The best shares are ``p_r ∝ 1 / u_r``; the *gain* of
moving to them is ``max_r(p_r u_r) * sum_r(1 / u_r)`` (1 when already balanced,
1.75 for four replicas of which one is half as fast under equal shares).

Hysteresis, so the plan does not flap on timing noise: a re-plan needs the
predicted speed-up of the proposed weights over the current ones to exceed
``threshold`` at ``patience`` consecutive checks (or ``urgent`` at one check), no re-plan happens
within ``cooldown`` checks of the last one, and proposed weights are rounded to
multiples of ``resolution`` (relative to the fastest replica, weight 1). Rounding
also makes every worker of a multi-worker job, fed the same all-gathered
measurements, plan with bit-identical weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["RebalanceOptions", "SpeedEstimator", "Rebalancer", "Decision", "gain", "step_imbalance",
           "feasible_weights"]


@dataclass(frozen=True)
class RebalanceOptions:
    """When measured speeds re-plan the rest of an epoch.

    Args:
        enabled: re-plan at all (the measurements and telemetry are taken either way).
        threshold: re-plan when the predicted gain (time of a step under the current
            weights / under the measured-best weights) exceeds this, > 1.
        patience: consecutive checks the gain must exceed ``threshold``, >= 1.
        urgent: a gain above this re-plans at the first check (an imbalance this large is
            not timing noise), >= ``threshold``.
        cooldown: checks after a re-plan during which no other one happens, >= 0.
        smoothing: weight of the newest window in the exponential moving average of
            seconds per unit, in (0, 1].
        jump: a window that differs from a replica's average by more than this fraction
            replaces the average (a device that really changed speed, e.g. throttled, is
            followed at once instead of over several windows), > 0.
        resolution: weights are rounded to multiples of this (fastest replica = 1), in (0, 0.5].
        warmup: steps after the start of a run or a re-plan whose timings are ignored
            (they include tracing and pipeline start-up), >= 0.
    """

    enabled: bool = True
    threshold: float = 1.10
    patience: int = 2
    urgent: float = 1.5
    cooldown: int = 2
    smoothing: float = 0.5
    jump: float = 0.3
    resolution: float = 0.02
    warmup: int = 1

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise TypeError(f"enabled must be True or False, got {self.enabled!r}")
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold) and self.threshold > 1):
            raise ValueError(f"threshold must be a number > 1 (1.10 = re-plan when 10% faster steps are "
                             f"predicted), got {self.threshold!r}")
        if not (isinstance(self.urgent, (int, float)) and self.urgent >= self.threshold):
            raise ValueError(f"urgent must be a number >= threshold ({self.threshold:g}), got {self.urgent!r}")
        for name, low in (("patience", 1), ("cooldown", 0), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not (isinstance(self.smoothing, (int, float)) and 0 < self.smoothing <= 1):
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing!r}")
        if not (isinstance(self.jump, (int, float)) and self.jump > 0):
            raise ValueError(f"jump must be a number > 0 (0.3 = a 30% change), got {self.jump!r}")
        if not (isinstance(self.resolution, (int, float)) and 0 < self.resolution <= 0.5):
            raise ValueError(f"resolution must be in (0, 0.5], got {self.resolution!r}")


class SpeedEstimator:
    """Exponential moving average of each replica's seconds per unit of load.

    Args:
        replicas: R.
        smoothing: weight of each new window, in (0, 1].
        jump: a window more than this fraction away from the average replaces it.
    """

    def __init__(self, replicas: int, smoothing: float = 0.5, jump: float = float("inf")):
        self.replicas, self.smoothing, self.jump = int(replicas), float(smoothing), float(jump)
        self.seconds_per_unit = np.full(self.replicas, np.nan)

    def update(self, load: np.ndarray, seconds: np.ndarray) -> None:
        """Add one window: per replica its summed load and summed compute seconds.

        A replica with no load or no time in the window keeps its estimate.
        """
        load, seconds = np.asarray(load, np.float64), np.asarray(seconds, np.float64)
        if load.shape != (self.replicas,) or seconds.shape != (self.replicas,):
            raise ValueError(f"load and seconds must have one entry per replica ({self.replicas}), "
                             f"got shapes {load.shape} and {seconds.shape}")
        ok = (load > 0) & (seconds > 0) & np.isfinite(seconds)
        rate = np.where(ok, seconds / np.where(ok, load, 1.0), np.nan)
        fresh = ok & np.isnan(self.seconds_per_unit)
        with np.errstate(invalid="ignore"):
            fresh |= ok & (np.abs(rate / self.seconds_per_unit - 1) > self.jump)
        self.seconds_per_unit[fresh] = rate[fresh]
        old = ok & ~fresh
        a = self.smoothing
        self.seconds_per_unit[old] = (1 - a) * self.seconds_per_unit[old] + a * rate[old]

    @property
    def ready(self) -> bool:
        """True once every replica has an estimate."""
        return bool(np.all(np.isfinite(self.seconds_per_unit)))

    def speeds(self) -> np.ndarray:
        """Units of load per second per replica (NaN where not measured yet)."""
        return 1.0 / self.seconds_per_unit


def gain(shares: np.ndarray, seconds_per_unit: np.ndarray) -> float:
    """How many times faster a step would be under the best shares than under ``shares``."""
    u = np.asarray(seconds_per_unit, np.float64)
    return float(np.max(np.asarray(shares, np.float64) * u) * np.sum(1.0 / u))


def step_imbalance(shares: np.ndarray, seconds_per_unit: np.ndarray) -> float:
    """Predicted max over replicas of their step time / the mean step time."""
    t = np.asarray(shares, np.float64) * np.asarray(seconds_per_unit, np.float64)
    return float(t.max() / t.mean())


def feasible_weights(weights: np.ndarray, global_batch_size: int) -> np.ndarray:
    """Raise the smallest weights so that every replica's share of a full step is >= 1.5 samples.

    A plan refuses weights that leave a replica without samples in a full step; a
    replica measured as very slow still gets a little work (and so keeps being measured).
    """
    w = np.asarray(weights, np.float64).copy()
    floor = min(1.5 / global_batch_size, 1.0 / len(w))
    for _ in range(8):  # raising one weight lowers the others' shares a little: converges in a few rounds
        share = w / w.sum()
        low = share < floor
        if not low.any():
            break
        w[low] = floor * w[~low].sum() / (1 - floor * low.sum()) if (~low).any() else w[low]
    return w


@dataclass(frozen=True)
class Decision:
    """The outcome of one check: new weights (None = keep) and what was predicted.

    ``gain`` is the predicted step speed-up of the proposed (rounded) weights over the
    weights in use; the imbalances are max/mean of the predicted replica times.
    """

    weights: tuple[float, ...] | None
    speeds: tuple[float, ...]
    gain: float
    imbalance_before: float
    imbalance_after: float


class Rebalancer:
    """Decides, from windows of measurements, when to change the plan's weights.

    Args:
        replicas: R.
        options: :class:`RebalanceOptions`.
        global_batch_size: G, to keep every replica's share of a step at one sample or more.
        weights: the weights the plan uses now (default equal).
    """

    def __init__(self, replicas: int, options: RebalanceOptions = RebalanceOptions(), global_batch_size: int = 1,
                 weights=None):
        self.options, self.global_batch_size = options, int(global_batch_size)
        self.estimator = SpeedEstimator(replicas, options.smoothing, options.jump)
        self.weights = tuple(float(x) for x in (np.ones(replicas) if weights is None else weights))
        self._streak = 0
        self._cooldown = 0

    @property
    def shares(self) -> np.ndarray:
        w = np.asarray(self.weights, np.float64)
        return w / w.sum()

    def propose(self) -> tuple[float, ...]:
        """The measured-best weights, rounded; the fastest replica has weight 1."""
        speed = self.estimator.speeds()
        rel = speed / speed.max()
        res = self.options.resolution
        rel = np.maximum(np.round(rel / res) * res, res)
        rel = feasible_weights(rel, self.global_batch_size)
        return tuple(float(round(x, 6)) for x in rel)

    def check(self, load: np.ndarray, seconds: np.ndarray) -> Decision | None:
        """Feed one window (per replica summed load and compute seconds); None until every replica is measured."""
        self.estimator.update(load, seconds)
        if not self.estimator.ready:
            return None
        u = self.estimator.seconds_per_unit
        proposal = self.propose()
        new_shares = np.asarray(proposal) / np.sum(proposal)
        # The predicted speed-up of the proposal itself (rounded, floored) over the weights in use.
        g = float(np.max(self.shares * u) / np.max(new_shares * u))
        before, after = step_imbalance(self.shares, u), step_imbalance(new_shares, u)
        speeds = tuple(float(x) for x in self.estimator.speeds())
        self._streak = self._streak + 1 if g > self.options.threshold else 0
        if self._cooldown > 0:
            self._cooldown -= 1
            return Decision(None, speeds, g, before, after)
        patient = self._streak >= self.options.patience or g > self.options.urgent
        if not self.options.enabled or not patient or proposal == self.weights:
            return Decision(None, speeds, g, before, after)
        self.weights, self._streak, self._cooldown = proposal, 0, self.options.cooldown
        return Decision(proposal, speeds, g, before, after)
