"""Whether the updates measured so far back a re-plan: the evidence :class:`~evenflow.plan.speed.rebalancer.Rebalancer` asks for.

A check's predicted gain comes from averages and fitted lines, which a few odd updates can
move: a process starting on one replica's core, a page-cache miss, the first steps after a
start. Acting on them costs twice: the plan moves to weights the replicas' real speeds do not
support, and the steps under those weights are then the baseline the next decision is judged
against. :class:`GainEvidence` keeps, per update of the weights in use, the gain that update
alone predicts, and backs a re-plan only when most of a window of them agree. The window is
longer the closer their gains are to the threshold: a gain of 1.12 against a threshold of 1.10
needs the full window (a few updates of a replica 25% slow are everyday noise), one of 1.5 only
:data:`MIN_UPDATES` (a replica twice as slow for that many updates is not).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

# The share of a window's updates that must each show a gain above the threshold.
AGREE = 0.75
# The fewest updates that back a re-plan, however large their gain (a device's change of speed is
# confirmed over as many).
MIN_UPDATES = 3


def update_gain(load: np.ndarray, seconds: np.ndarray, step_seconds: float) -> float:
    """How much faster one update would have been with the loads in proportion to the speeds it measured.

    ``load`` and ``seconds`` per replica: the update's load and compute seconds; ``step_seconds``:
    the whole update. Its time outside the slowest replica's compute is kept as it was. NaN when a
    replica had no load or no time (nothing to say about its speed).
    """
    load, seconds = np.asarray(load, np.float64), np.asarray(seconds, np.float64)
    if not ((load > 0).all() and (seconds > 0).all() and np.isfinite(seconds).all()):
        return float("nan")
    slowest = float(seconds.max())
    outside = max(float(step_seconds) - slowest, 0.0)
    balanced = float(load.sum() / np.sum(load / seconds))
    return (slowest + outside) / (balanced + outside)


class GainEvidence:
    """The per-update gains of the weights in use, and whether they back a re-plan.

    Args:
        need: updates a re-plan needs at a gain just above the threshold
            (``RebalanceOptions.evidence``), >= 1; at median gain ``g`` it needs
            ``need * (threshold - 1) / (g - 1)`` of them, at least :data:`MIN_UPDATES`.
        threshold: the gain each of them must show (``RebalanceOptions.threshold``).

    After a device's confirmed change of speed (:meth:`clear` with ``changed=True``) the first
    ``need`` updates back a re-plan on fewer of them (:attr:`since_change`).
    """

    def __init__(self, need: int, threshold: float):
        self.need, self.threshold = int(need), float(threshold)
        self._gains: deque = deque(maxlen=self.need)
        self._changed = False
        self._added = 0  # updates added since the last clear

    def __len__(self) -> int:
        return len(self._gains)

    @property
    def added(self) -> int:
        """Updates added since the last :meth:`clear` (new weights, or a device's new speed)."""
        return self._added

    @property
    def since_change(self) -> bool:
        """True within ``need`` updates of a device's confirmed change of speed (the change detector
        already asked several updates in a row): the updates since it then suffice."""
        return self._changed and self._added <= self.need

    def add(self, load: np.ndarray, seconds: np.ndarray, step_seconds: float) -> None:
        """One update of the weights in use."""
        g = update_gain(load, seconds, step_seconds)
        if np.isfinite(g):
            self._gains.append(g)
            self._added += 1

    def clear(self, changed: bool = False) -> None:
        """New weights (``changed=False``) or a device's new speed (``changed=True``): start again."""
        self._gains.clear()
        self._changed, self._added = bool(changed), 0

    def window(self, threshold: float | None = None) -> int:
        """Updates that must agree now: fewer the larger the median gain (see ``need``).

        ``threshold``: the gain to show, when not the one given at construction (a refining move's).
        """
        bar = self.threshold if threshold is None else float(threshold)
        margin = float(np.median(self._gains)) - 1 if self._gains else 0.0
        if margin <= bar - 1:
            return self.need
        return min(self.need, max(MIN_UPDATES, math.ceil(self.need * (bar - 1) / margin)))

    def backs(self, after_change: int, threshold: float | None = None) -> bool:
        """True when the last :meth:`window` updates (at most ``after_change`` since a confirmed
        change) agree that a re-plan gains more than the threshold: 3 in 4 of them each show it,
        the newest one too (a slowdown that just ended is no reason to move)."""
        bar = self.threshold if threshold is None else float(threshold)
        need = self.window(bar)
        if self.since_change:
            need = min(need, after_change)
        if len(self._gains) < need:
            return False
        last = np.asarray(self._gains)[-need:]
        return float(np.mean(last > bar)) >= AGREE and bool(last[-1] > bar)
