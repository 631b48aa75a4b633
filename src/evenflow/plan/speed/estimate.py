"""Each replica's measured seconds per unit of load: an exponential moving average that follows real changes.

Framework-free; :class:`~evenflow.plan.speed.rebalancer.Rebalancer` keeps one.
"""
from __future__ import annotations

import numpy as np


class SpeedEstimator:
    """Exponential moving average of each replica's seconds per unit of load.

    Args:
        replicas: R.
        smoothing: weight of each new window, in (0, 1].
        jump: a window more than this fraction away from the average replaces it when the next
            window is off the same way; it is averaged in late when the next is off the same way
            by more than half as much, and left out when the next is not.
    """

    def __init__(self, replicas: int, smoothing: float = 0.5, jump: float = float("inf")):
        self.replicas, self.smoothing, self.jump = int(replicas), float(smoothing), float(jump)
        self.seconds_per_unit = np.full(self.replicas, np.nan)
        self._last_load = np.full(self.replicas, np.nan)
        self._pending = np.zeros(self.replicas)  # direction of an unconfirmed jump, per replica
        self._held = np.full(self.replicas, np.nan)  # its rate, left out of the average so far

    def update(self, load: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """Add one window: per replica its summed load and summed compute seconds.

        A replica with no load or no time in the window keeps its estimate. Returns which
        replicas' estimates jumped (a change of speed, not noise).
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
        # A jump at an unchanged load, seen in two windows in a row in the same direction, is a
        # device that changed speed (one window off is timing noise: a busy core's scheduler alone
        # moves a window by 30% or more); at a new load (after a re-plan) the rate per unit also
        # moves by the step's fixed part, which is no news. The first window off is held out of
        # the average until the next one tells: averaged in, a real change would show as a value
        # between the old speed and the new one, and a re-plan to it would go only part of the way.
        same = np.isclose(load, self._last_load, rtol=0.02)
        known = np.isfinite(self.seconds_per_unit)
        with np.errstate(invalid="ignore"):
            side = np.sign(rate / self.seconds_per_unit - 1)
        candidate = fresh & known & same
        jumped = candidate & (self._pending == side)
        held = candidate & ~jumped
        a = self.smoothing
        # The window held last time, when this one is off the same way by less than a jump but
        # more than half of one (a change of about the jump's size, seen through noise): averaged
        # in late. Back near the average: it was noise, and is dropped.
        with np.errstate(invalid="ignore"):
            late = (self._pending != 0) & ~jumped & ok & known & (side == self._pending) \
                & (np.abs(rate / self.seconds_per_unit - 1) > self.jump / 2)
        self.seconds_per_unit[late] = (1 - a) * self.seconds_per_unit[late] + a * self._held[late]
        self._pending = np.where(held, side, 0.0)
        self._held = np.where(held, rate, np.nan)
        fresh &= ~known | ~same | jumped
        self._last_load = np.where(ok, load, self._last_load)
        self.seconds_per_unit[fresh] = rate[fresh]
        old = ok & ~fresh & ~held
        self.seconds_per_unit[old] = (1 - a) * self.seconds_per_unit[old] + a * rate[old]
        return jumped

    def restart(self, which: np.ndarray, load: np.ndarray, seconds: np.ndarray) -> None:
        """Replace the estimates of replicas ``which`` by ``seconds / load`` (a speed change seen elsewhere)."""
        which = np.asarray(which, bool) & (np.asarray(load) > 0) & (np.asarray(seconds) > 0)
        self.seconds_per_unit[which] = np.asarray(seconds, np.float64)[which] / np.asarray(load, np.float64)[which]
        self._pending[which], self._held[which] = 0.0, np.nan

    @property
    def ready(self) -> bool:
        """True once every replica has an estimate."""
        return bool(np.all(np.isfinite(self.seconds_per_unit)))

    def speeds(self) -> np.ndarray:
        """Units of load per second per replica (NaN where not measured yet)."""
        return 1.0 / self.seconds_per_unit
