"""When measured speeds re-plan the rest of an epoch: the options of :class:`~evenflow.plan.speed.rebalancer.Rebalancer`."""
from __future__ import annotations

from dataclasses import dataclass

from evenflow.util.validate import check_bool, check_int, check_number, set_checked


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
        payback: a re-plan must be predicted to save this many times its own measured cost
            (a switch of the pipelines' plan, or pipelines rebuilt and refilled) over the steps
            left, >= 0 (0: no such check).
        review: updates after a re-plan whose median step time is compared with the median
            before it; a re-plan that made steps slower is corrected or undone, >= 1.
        corrections: a re-plan that made steps slower is first re-aimed from the
            per-replica lines its own steps measured (see :mod:`evenflow.plan.speed.step_model`), up
            to this many times in a row, each reviewed against the steps before the first;
            then undone, >= 0.
        evidence: with per-update measurements, a gain under ``urgent`` re-plans only when
            3 in 4 of the last updates of the weights in use, the newest among them, each on
            its own show a gain above ``threshold``: this many updates for a gain just above
            it, fewer for larger gains (``evidence * (threshold - 1) / (gain - 1)``, at least
            3; see :mod:`evenflow.plan.speed.evidence`), so a few slow updates, a process starting on
            a core, do not move the plan. After a device's confirmed change of speed the
            updates since the change suffice, >= 1.
        refine: after a re-plan that its review measured as faster (by more than timing noise),
            with every replica's line measured, a further move re-plans at a gain above
            ``1 + refine * (threshold - 1)`` (1.05 by default) instead of ``threshold``, under the
            same evidence, patience and review. The lines measured at two loads predict a small
            move better than one load predicts the first. A re-plan too early to review is
            refined when it came right after a device's confirmed change of speed (it was made on
            the few updates since), once ``review`` updates ran under it; one in a run's first
            updates is not (a start-up hiccup looks the same). A further move that measures
            slower is undone, without holding the next re-plan at ``threshold`` back; one that
            measures within timing noise ends the refining. In (0, 1] (1: every move needs
            ``threshold``).
    """

    enabled: bool = True
    threshold: float = 1.10
    patience: int = 2
    urgent: float = 1.5
    cooldown: int = 2
    smoothing: float = 0.5
    jump: float = 0.5
    resolution: float = 0.02
    warmup: int = 1
    payback: float = 1.5
    review: int = 16
    corrections: int = 2
    evidence: int = 8
    refine: float = 0.5

    def __post_init__(self):
        set_checked(self, "enabled", check_bool)
        threshold = set_checked(self, "threshold", check_number, 1, low_open=True,
                                 fix="1.10 = re-plan when 10% faster steps are predicted")
        set_checked(self, "urgent", check_number, threshold, finite=False,
                     fix=f"urgent is at least threshold: with threshold={threshold:g} pass urgent={threshold:g} or more")
        set_checked(self, "payback", check_number, 0, fix="2 = a re-plan must save twice its cost")
        for name, low in (("patience", 1), ("cooldown", 0), ("warmup", 0), ("review", 1), ("corrections", 0),
                          ("evidence", 1)):
            set_checked(self, name, check_int, low)
        set_checked(self, "smoothing", check_number, 0, 1, low_open=True, fix="e.g. 0.5")
        set_checked(self, "jump", check_number, 0, low_open=True, finite=False, fix="0.3 = a 30% change")
        set_checked(self, "refine", check_number, 0, 1, low_open=True,
                     fix="0.5 = a further move needs half the threshold's margin")
        set_checked(self, "resolution", check_number, 0, 0.5, low_open=True, fix="e.g. 0.02")

    @property
    def refine_threshold(self) -> float:
        """The gain a further move needs once a re-plan made steps faster (see ``refine``)."""
        return 1 + self.refine * (self.threshold - 1)
