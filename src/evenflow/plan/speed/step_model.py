"""What a step costs each replica: a fixed part plus a part per unit of load, and whether a re-plan paid.

A replica's compute time in a step is ``a_r + b_r * load_r``: ``a_r`` is what the step costs
whatever its batch (kernel launches, the optimizer, framework dispatch), ``b_r`` the time per
sample (or per unit of cost). Under equal weights every replica sees the same load in every
full step, so only ``a_r + b_r * load`` is known and the split between ``a`` and ``b`` is not:
a model that assumes ``a = 0`` predicts that halving a slow replica's batch halves its time,
which is false where the fixed part dominates (short steps), and a re-plan made on it slows the
run down. :class:`StepModel` therefore fits the line only from loads that differ enough (an
epoch's last, partial step; steps after a re-plan; cost-balanced batches), by least squares
over the median time at each load, and says per replica whether the line is known.

:func:`best_shares` splits a step's load so the slowest replica finishes first-as-possible
under the fitted lines (water-filling). :class:`ReplanReview` compares the step time measured
after a re-plan with the one before it: a re-plan that did not make steps faster is undone.
:class:`SpeedChange` notices a replica whose steps left its line (a device that slowed down or
recovered), so the lines are measured again instead of being outvoted by old steps.
Framework-free; :class:`~evenflow.plan.speed.rebalancer.Rebalancer` uses all four.
"""
from __future__ import annotations

from collections import deque

import numpy as np

# Loads differ "enough" to separate the fixed part from the per-unit part when the largest is
# this many times the smallest (below, timing noise dominates the slope).
SPREAD = 1.25
# Below that spread, a line is still used when there are this many rows (2 at each outer load) and the slope's
# standard error is under this fraction of the slope (see _sure).
SURE_ROWS = 8
SURE_ERROR = 0.15


class StepModel:
    """Per replica, compute seconds as ``a + b * load``, from the last ``keep`` updates.

    Args:
        replicas: R.
        keep: updates remembered per replica; partial and re-planned steps are kept in a
            second buffer of their own, so a long run of full steps does not push them out.
    """

    def __init__(self, replicas: int, keep: int = 64):
        self.replicas = int(replicas)
        self._recent: deque = deque(maxlen=keep)
        self._other: deque = deque(maxlen=keep)
        self._last: np.ndarray | None = None

    def add(self, load: np.ndarray, seconds: np.ndarray) -> None:
        """One update: per replica its load and compute seconds."""
        load, seconds = np.asarray(load, np.float64), np.asarray(seconds, np.float64)
        if load.shape != (self.replicas,) or seconds.shape != (self.replicas,):
            raise ValueError(f"load and seconds must have one entry per replica ({self.replicas}), "
                             f"got shapes {load.shape} and {seconds.shape}")
        row = np.stack([load, seconds])
        self._last = load
        usual = self._recent[-1][0] if self._recent else None
        if usual is not None and not np.allclose(load, usual, rtol=0.02):
            self._other.append(row)
        else:
            self._recent.append(row)

    def __len__(self) -> int:
        """Updates remembered."""
        return len(self._recent) + len(self._other)

    def fit(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(a, b, known)``: per replica the fixed seconds, the seconds per unit of load, and
        whether its line is known: measured from loads that spread enough (or from a small move
        that steady steps measure well, see :func:`_sure`), or borrowed from the measured ones
        (see :func:`_borrow`). Else ``a`` is 0 and ``b`` the mean rate."""
        rows = list(self._recent) + list(self._other)
        a, b, known = np.zeros(self.replicas), np.full(self.replicas, np.nan), np.zeros(self.replicas, bool)
        if not rows:
            return a, b, known
        data = np.stack(rows)  # [n, 2, R]
        for r in range(self.replicas):
            load, secs = data[:, 0, r], data[:, 1, r]
            ok = (load > 0) & (secs > 0) & np.isfinite(secs)
            if ok.any():
                a[r], b[r], known[r] = _line(load[ok], secs[ok])
        return _borrow(a, b, known, self._last)


def _line(load: np.ndarray, secs: np.ndarray) -> tuple[float, float, bool]:
    """``(a, b, known)`` of one replica's rows (see :meth:`StepModel.fit`)."""
    rate = float(np.median(secs / load))
    key = np.round(load, 6)
    levels = np.unique(key)
    if levels.size < 2:
        return 0.0, rate, False
    med = np.array([np.median(secs[key == x]) for x in levels])
    weight = np.array([np.sum(key == x) for x in levels], np.float64)
    slope, intercept = np.polyfit(levels, med, 1, w=np.sqrt(weight))
    if levels.max() < SPREAD * levels.min() and not _sure(load, secs, slope, intercept):
        return 0.0, rate, False
    if slope <= 0:  # time does not grow with load: all of it is fixed
        slope, intercept = 1e-9 / max(levels.max(), 1.0), float(np.average(med, weights=weight))
    if intercept < 0:  # through the origin instead
        slope, intercept = float(np.sum(weight * levels * med) / np.sum(weight * levels ** 2)), 0.0
    return float(intercept), float(slope), True


def _borrow(a: np.ndarray, b: np.ndarray, known: np.ndarray, load: np.ndarray) -> tuple:
    """Lines for the replicas whose own loads barely moved, from those whose lines are measured.

    The replicas run the same model, and a slower device stretches its fixed part and its
    per-unit part alike, so the fixed part's fraction of a step is about the same on every
    replica. A replica without a line of its own gets that fraction (the median over the
    measured ones, each at its latest load) of its mean time at its latest load. A re-plan
    moves the slow replica's load the most, so its line is measured first; the others' loads
    move by a fraction of that, too little for their own lines.
    """
    if known.all() or not known.any() or load is None:
        return a, b, known
    measured = known & (load > 0)
    if not measured.any():
        return a, b, known
    fraction = float(np.median(a[measured] / (a[measured] + b[measured] * load[measured])))
    fill = ~known & (load > 0) & np.isfinite(b)
    time = b * load  # b is a rate (mean seconds per unit) where the line is not known
    a, b = np.where(fill, fraction * time, a), np.where(fill, (1 - fraction) * time / np.maximum(load, 1e-12), b)
    return a, b, known | fill


def _sure(load: np.ndarray, secs: np.ndarray, slope: float, intercept: float) -> bool:
    """Whether a slope from loads that spread less than :data:`SPREAD` is still measured well.

    It is when there are :data:`SURE_ROWS` rows, two or more at each outer load, and the slope's standard
    error (from the rows' robust spread about the line) is under :data:`SURE_ERROR` of the
    slope: long, steady steps measure a line from a small move; short, noisy ones do not.
    """
    lo, hi = load.min(), load.max()
    if slope <= 0 or min(np.sum(load == lo), np.sum(load == hi)) < 2 or load.size < SURE_ROWS:
        return False
    residual = secs - (intercept + slope * load)
    sigma = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
    spread = float(np.sqrt(np.sum((load - load.mean()) ** 2)))
    return spread > 0 and sigma / spread < SURE_ERROR * slope


def step_time(shares: np.ndarray, total: float, a: np.ndarray, b: np.ndarray) -> float:
    """The slowest replica's compute seconds when each gets ``shares * total`` load."""
    return float(np.max(np.asarray(a) + np.asarray(b) * np.asarray(shares) * total))


def best_shares(total: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Shares of ``total`` load that minimise the slowest replica's ``a_r + b_r * load_r``.

    Every replica working finishes at the same time ``T``: ``load_r = (T - a_r) / b_r``; a
    replica whose fixed part alone exceeds ``T`` gets nothing (it still runs the step).
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    active = np.ones(a.shape, bool)
    for _ in range(a.size):
        t = (total + np.sum(a[active] / b[active])) / np.sum(1.0 / b[active])
        out = active & (a >= t)
        if not out.any():
            break
        active &= ~out
    load = np.where(active, (t - a) / b, 0.0)
    return load / load.sum()


class ReplanReview:
    """Was a re-plan worth it? Median step seconds over ``window`` updates before and after.

    A re-plan that made steps slower (by more than ``margin``) is not kept: :meth:`verdict`
    returns ``"undo"`` and the weights from before it.
    """

    def __init__(self, window: int = 8, margin: float = 0.02):
        self.window, self.margin = int(window), float(margin)
        self._before: deque = deque(maxlen=self.window)
        self._after: list[float] = []
        self._pending: tuple[tuple[float, ...], float] | None = None  # weights before, median step before
        self._judged: tuple[tuple[float, ...], float] | None = None   # the last pending judged "undo"

    def add(self, step_seconds: float) -> None:
        """One update's step time (the slowest replica's, from start to update applied)."""
        if self._pending is None:
            self._before.append(float(step_seconds))
        else:
            self._after.append(float(step_seconds))

    @property
    def reviewing(self) -> bool:
        return self._pending is not None

    def replanned(self, weights_before: tuple[float, ...]) -> None:
        """A re-plan happened: the next ``window`` updates are measured against the last ones.

        Not reviewed when fewer than half a window was measured before it (a re-plan right
        after the start, or right after a device changed speed, which restarts the review):
        the median of one or two steps is timing noise, and judging by it undid re-plans that
        paid.
        """
        if len(self._before) >= max(2, self.window // 2):
            self._pending, self._after = (tuple(weights_before), float(np.median(self._before))), []

    def verdict(self) -> tuple[str, tuple[float, ...] | None, float]:
        """``("wait" | "kept" | "even" | "undo", weights to return to, speed-up measured)``: faster
        by more than ``margin``, within it either way (timing noise cannot tell), slower by more."""
        if self._pending is None or len(self._after) < self.window:
            return "wait", None, float("nan")
        weights, before = self._pending
        after = float(np.median(self._after))
        self._judged = self._pending
        self._pending, self._before = None, deque(self._after[-self.window:], maxlen=self.window)
        speedup = before / after if after > 0 and np.isfinite(before) else float("nan")
        if np.isfinite(speedup) and speedup < 1 - self.margin:
            return "undo", weights, speedup
        if np.isfinite(speedup) and speedup < 1 + self.margin:
            return "even", None, speedup
        return "kept", None, speedup

    def retry(self) -> None:
        """The re-plan judged ``"undo"`` is corrected instead: measure the next ``window`` updates
        against the same step time from before the first re-plan (and undo back to its weights)."""
        if self._judged is not None:
            self._pending, self._after, self._judged = self._judged, [], None


class SpeedChange:
    """A replica whose compute left its line: ``confirm`` updates in a row off it by more than
    ``jump`` (a fraction of the predicted time), all the same way, or one update fewer when they
    are all off by more than twice ``jump`` at the load of the update before.

    One update off is timing noise (a busy core's scheduler alone moves one by 30% or more);
    several in a row are a device that changed speed. Judging each update against the line at
    its own load also sees a change that comes with a new load (a re-plan, an epoch's last step).

    Args:
        replicas: R.
        jump: the fraction off the line that counts, > 0.
        confirm: updates in a row, >= 1.
    """

    def __init__(self, replicas: int, jump: float, confirm: int = 3):
        self.jump, self.confirm = float(jump), int(confirm)
        self._side = np.zeros(int(replicas))
        self._count = np.zeros(int(replicas), int)
        self._far = np.zeros(int(replicas), int)  # the same, off by more than twice ``jump``
        self.recent: deque = deque(maxlen=self.confirm)  # the last updates: (load, seconds, step seconds)
        self.run = 0  # updates off the line that the last change was seen in (the last of ``recent``)

    def add(self, load: np.ndarray, seconds: np.ndarray, step_seconds: float,
            fit: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """One update, judged against ``fit`` (:meth:`StepModel.fit` before it); which replicas changed speed."""
        a, b, _ = fit
        load, seconds = np.asarray(load, np.float64), np.asarray(seconds, np.float64)
        steady = np.isclose(load, self.recent[-1][0], rtol=0.02) if self.recent else np.zeros(len(load), bool)
        self.recent.append((load, seconds, float(step_seconds)))
        with np.errstate(invalid="ignore", divide="ignore"):
            predicted = a + b * load
            ok = (load > 0) & (seconds > 0) & np.isfinite(predicted) & (predicted > 0)
            off = np.where(ok, seconds / np.where(ok, predicted, 1.0) - 1, 0.0)
        side = np.where(np.abs(off) > self.jump, np.sign(off), 0.0)
        far = (np.abs(off) > 2 * self.jump) & steady  # at a new load its line may be what is off
        self._count = np.where((side != 0) & (side == self._side), self._count + 1, (side != 0).astype(int))
        self._far = np.where(far & (side == self._side), self._far + 1, far.astype(int))
        self._side = side
        far_run = self._far >= self.confirm - 1
        changed = (self._count >= self.confirm) | far_run
        self.run = (self.confirm - int(far_run.any())) if changed.any() else 0
        self._count[changed], self._far[changed], self._side[changed] = 0, 0, 0.0
        return changed
