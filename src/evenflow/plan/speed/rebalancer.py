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
``threshold`` at ``patience`` consecutive checks (or ``urgent`` at one check) and, fed
per-update rows, in most of the last ``evidence`` updates each on its own
(:mod:`evenflow.plan.speed.evidence`; after a device's confirmed change of speed, the updates
since the change are enough and the first check after it may re-plan), no re-plan happens
within ``cooldown`` checks of the last one, and proposed weights are rounded to
multiples of ``resolution`` (relative to the fastest replica, weight 1). Rounding
also makes every worker of a multi-worker job, fed the same all-gathered
measurements, plan with bit-identical weights.

Fed per-update rows too (:meth:`Rebalancer.observe`), it predicts better and never
re-plans at a loss: each replica's time is a fixed part plus a part per unit of load
(:class:`~evenflow.plan.speed.step_model.StepModel`, known once loads have differed), the
proposal minimises the slowest replica under those lines, the predicted gain counts
the step's overhead outside the replicas' compute, and a re-plan must save ``payback``
times its measured cost over the steps left. While the fixed parts are unknown (equal
loads so far) time is taken as proportional to load. That overstates the gain where fixed
parts dominate, but its split never makes the replicas' compute slower: with lines whose
fixed parts are >= 0, a replica that loses load takes at least its predicted time and less
than before, one that gains load at most its predicted time, so the slowest after the move
is one that lost load, faster than before. A re-plan that made steps slower
(:class:`~evenflow.plan.speed.step_model.ReplanReview`) is re-aimed from the lines its own steps
measured (``corrections`` times at most), else undone, and no re-plan follows for ``review`` checks
(twice as many after each undo in a row) unless a device's speed changes. After a re-plan that made
steps faster, or one right after a device's confirmed change of speed, smaller moves follow (``refine``).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from evenflow.plan.speed.evidence import GainEvidence
from evenflow.plan.speed.options import RebalanceOptions
from evenflow.plan.speed.shares import feasible_weights, step_imbalance
from evenflow.plan.speed.estimate import SpeedEstimator
from evenflow.plan.speed.step_model import ReplanReview, SpeedChange, StepModel, best_shares, step_time


@dataclass(frozen=True)
class Decision:
    """The outcome of one check: new weights (None = keep) and what was predicted.

    ``gain`` is the predicted step speed-up of the proposed (rounded) weights over the
    weights in use; the imbalances are max/mean of the predicted replica times. ``reason``
    says why the weights change or stay: ``"replan"``, ``"correct"`` (the last re-plan made
    steps slower: re-aimed from the lines its steps measured), ``"undo"`` (it made steps
    slower and the lines point nowhere better: back to the weights before it),
    ``"payback"`` (a gain that would not repay the re-plan's cost over the steps left),
    ``"review"`` (the last re-plan is still being measured) or ``""``. With ``"payback"``,
    ``saving`` is the seconds the proposed weights were predicted to save over the steps left.
    """

    weights: tuple[float, ...] | None
    speeds: tuple[float, ...]
    gain: float
    imbalance_before: float
    imbalance_after: float
    reason: str = ""
    saving: float = float("nan")


class Rebalancer:
    """Decides, from windows of measurements, when to change the plan's weights.

    Args:
        replicas: R.
        options: :class:`RebalanceOptions`.
        global_batch_size: G, to keep every replica's share of a step at one sample or more.
        weights: the weights the plan uses now (default equal).

    Attributes:
        replan_seconds: what one re-plan costs (median of those measured), or None.
        undone: re-plans undone because they made steps slower.
        held_back: checks whose gain would not have repaid a re-plan over the steps left.
    """

    def __init__(self, replicas: int, options: RebalanceOptions = RebalanceOptions(), global_batch_size: int = 1,
                 weights=None):
        self.options, self.global_batch_size = options, int(global_batch_size)
        self.estimator = SpeedEstimator(replicas, options.smoothing, options.jump)
        self.model = StepModel(replicas)
        self.review = ReplanReview(options.review)
        self.change = SpeedChange(replicas, options.jump)
        self.evidence = GainEvidence(options.evidence, options.threshold)
        self._observed = False  # per-update rows were fed (the evidence then gates re-plans)
        self._fit = None  # StepModel.fit() of the last check (None after a speed change)
        self.weights = tuple(float(x) for x in (np.ones(replicas) if weights is None else weights))
        self._streak = self._cooldown = 0
        self._overhead: deque = deque(maxlen=32)   # step seconds outside the slowest replica's compute
        self._total: deque = deque(maxlen=32)      # load of a step, summed over replicas
        self._costs: list[float] = []
        self.undone = self.held_back = 0
        self._blocked = 0      # checks left without re-plans after one was undone (or until a speed change)
        self._undos = 0        # undos since a re-plan last made steps faster (or a speed change)
        self._corrections = 0  # re-plans corrected from measured lines since the last one judged
        self._refining = False  # the last re-plan measured faster steps: smaller moves may follow
        self._after_change = False  # the last re-plan, unreviewed, came right after a device's change of speed
        self._tried = False     # the last re-plan was such a smaller move (its gain under the threshold)

    @property
    def shares(self) -> np.ndarray:
        w = np.asarray(self.weights, np.float64)
        return w / w.sum()

    @property
    def replan_seconds(self) -> float | None:
        return float(np.median(self._costs)) if self._costs else None

    def replan_cost(self, seconds: float) -> None:
        """Add one measured re-plan (or pipeline start) cost, in seconds."""
        if np.isfinite(seconds) and seconds >= 0:
            self._costs.append(float(seconds))

    def measured(self, load: np.ndarray, seconds: np.ndarray) -> None:
        """Rows ``[updates, R]`` for the replicas' lines only: steps of the weights in use that run
        after a re-plan was decided (their step times belong to no review)."""
        for lo, se in zip(np.atleast_2d(load), np.atleast_2d(seconds)):
            self.model.add(np.asarray(lo, np.float64), np.asarray(se, np.float64))

    def observe(self, load: np.ndarray, seconds: np.ndarray, step_seconds: np.ndarray) -> None:
        """Per-update rows: load and compute seconds ``[updates, R]``, step seconds ``[updates]``."""
        load, seconds = np.atleast_2d(np.asarray(load, np.float64)), np.atleast_2d(np.asarray(seconds, np.float64))
        self._observed = True
        for lo, se, st in zip(load, seconds, np.asarray(step_seconds, np.float64).reshape(-1)):
            # Judged against the lines of the last check: fitting them again per update would cost
            # ~0.7 ms of the training thread each time (4 replicas, 128 rows).
            changed = self.change.add(lo, se, st, self._fit) if self._fit is not None else None
            if changed is not None and changed.any():
                # Steps off the line, several in a row: measure the lines again from those steps on.
                self._restart()
                recent = list(self.change.recent)[-self.change.run:]  # the updates off the line
                for lo_, se_, st_ in recent[:-1]:
                    self.model.add(lo_, se_)
                    self.review.add(st_)
                    self.evidence.add(lo_, se_, st_)
                lo_sum, se_sum = np.sum([r[0] for r in recent], axis=0), np.sum([r[1] for r in recent], axis=0)
                self.estimator.restart(changed, lo_sum, se_sum)
            self.model.add(lo, se)
            self.review.add(st)
            self.evidence.add(lo, se, st)
            self._overhead.append(max(float(st - se.max()), 0.0))
            self._total.append(float(lo.sum()))

    def propose(self, fit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[float, ...]:
        """The measured-best weights, rounded; the fastest replica has weight 1.

        ``fit``: :meth:`StepModel.fit` already computed for this check (it loops over replicas).
        """
        a, b, known = self.model.fit() if fit is None else fit
        if known.all() and self._total:
            rel = best_shares(float(np.median(self._total)), a, b)
        else:
            speed = self.estimator.speeds()
            rel = speed / speed.max()
        return self._round(rel / rel.max())

    def _round(self, rel: np.ndarray) -> tuple[float, ...]:
        res = self.options.resolution
        rel = np.maximum(np.round(rel / res) * res, res)
        rel = feasible_weights(rel, self.global_batch_size)
        return tuple(float(round(x, 6)) for x in rel)

    def _lines(self, fit) -> tuple[np.ndarray, np.ndarray, float]:
        """Per replica (fixed seconds, seconds per unit) for predictions, and the step's load."""
        a, b, known = fit
        u = self.estimator.seconds_per_unit
        a, b = np.where(known, a, 0.0), np.where(known, b, u)
        return a, b, float(np.median(self._total)) if self._total else 1.0

    def check(self, load: np.ndarray, seconds: np.ndarray, steps_left: int | None = None) -> Decision | None:
        """Feed one window (per replica summed load and compute seconds); None until every replica is measured.

        ``steps_left``: steps the run has left; with :attr:`replan_seconds` known, a re-plan
        must save ``options.payback`` times its cost over them.
        """
        if self.estimator.update(load, seconds).any():
            self._restart()
        if not self.estimator.ready:
            return None
        fit = self._fit = self.model.fit()
        known = bool(fit[2].all()) or not len(self.model)  # no per-update rows: nothing to learn by waiting
        # A re-plan made on the few updates since a device's change of speed is refined once its own
        # steps fill a review window (a few noisy updates under it would move the lines as far).
        refine = self._refining or (self._after_change and self.evidence.added >= self.options.review)
        bar = self.options.refine_threshold if refine and fit[2].all() else self.options.threshold
        a, b, total = self._lines(fit)
        # While a replica's fixed part is unknown its time is taken as proportional to load: the
        # predicted gain is too high where fixed parts dominate, but the split is never slower than
        # the one in use (see the module docstring).
        target = self.propose(fit)
        overhead = float(np.median(self._overhead)) if self._overhead else 0.0
        now = step_time(self.shares, total, a, b)
        shares = np.asarray(target) / np.sum(target)
        then = step_time(shares, total, a, b)
        g = (now + overhead) / (then + overhead)  # the predicted speed-up over the weights in use
        before, after = step_imbalance(self.shares * total * b + a, 1), step_imbalance(shares * total * b + a, 1)
        speeds = tuple(float(x) for x in self.estimator.speeds())
        decision = lambda w, why: Decision(w, speeds, g, before, after, why)  # noqa: E731
        self._streak = self._streak + 1 if g > bar else 0
        judged = self._judge(known, target, g)
        if judged is not None:
            return decision(*judged)
        if self.review.reviewing:
            return decision(None, "review")
        if self._cooldown > 0:
            self._cooldown -= 1
            return decision(None, "")
        if self._blocked > 0:
            self._blocked -= 1
            return decision(None, "")
        # Under `urgent`, the updates themselves must agree (see evenflow.plan.speed.evidence); after a
        # device's confirmed change of speed, the updates since it are patience enough.
        backed = not self._observed or self.evidence.backs(self.change.confirm, bar)
        patient = g > self.options.urgent or (backed and g > bar and (
            self._streak >= self.options.patience or self.evidence.since_change))
        if not self.options.enabled or not patient or target == self.weights:
            return decision(None, "")
        cost = self.replan_seconds
        if steps_left is not None and cost is not None and steps_left * (now - then) < self.options.payback * cost:
            self.held_back += 1
            return replace(decision(None, "payback"), saving=float(steps_left * (now - then)))
        self.review.replanned(self.weights)
        # Unreviewed, it is refined after a device's confirmed change of speed, not at a run's start.
        self._after_change = self.evidence.since_change and not self.review.reviewing
        self.weights, self._streak, self._cooldown = target, 0, self.options.cooldown
        self._tried = g <= self.options.threshold
        self.evidence.clear()
        return decision(target, "replan")

    def _judge(self, known: bool, target, g_target: float) -> tuple[tuple[float, ...], str] | None:
        """Act on the review of the last re-plan: ``(weights, "correct" | "undo")``, or None."""
        verdict, back, _ = self.review.verdict()
        if verdict == "kept":
            self._corrections, self._undos = 0, 0
        elif verdict == "even":
            self._corrections = 0
        if verdict != "wait":  # only a move the steps showed is refined: else the next needs the threshold
            self._refining, self._after_change = verdict == "kept", False
        if verdict != "undo" or not self.options.enabled:
            return None
        if known and self._corrections < self.options.corrections and target not in (self.weights, back) \
                and g_target > self.options.threshold:
            # The re-plan missed, but its own steps measured the lines it lacked: aim again from
            # them, still judged against the steps before the first re-plan.
            self.review.retry()
            self._corrections += 1
            self.weights, self._streak, self._cooldown, self._tried = target, 0, self.options.cooldown, False
            self.evidence.clear()
            return target, "correct"
        # Back to the weights before, and none for a while, twice as long after each undo in a row
        # (a model that keeps predicting a gain the steps do not show would otherwise be tried
        # again and again). A refining move predicted less than the threshold: after its undo the
        # threshold alone holds the next one back.
        self.weights, self._streak, self._cooldown = back, 0, self.options.cooldown
        self.evidence.clear()
        if not self._tried:
            self._blocked = self.options.review * 2 ** min(self._undos, 10)
            self._undos += 1
        self.undone += 1
        self._corrections = 0
        return back, "undo"

    def _restart(self) -> None:
        """A device changed speed: its old lines and step times are stale, and a re-plan that did
        not pay before may pay now."""
        self.model, self.review = StepModel(self.model.replicas), ReplanReview(self.options.review)
        self._blocked, self._corrections, self._undos, self._fit = 0, 0, 0, None
        self._refining = self._after_change = False
        self.evidence.clear(changed=True)
