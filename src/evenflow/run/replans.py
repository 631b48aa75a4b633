"""The plan a training loop runs, and how the monitor's re-plans replace it.

A :class:`~evenflow.run.monitor.ReplicaMonitor` decides new replica weights from measured
speeds (identically on every process). :class:`PlanSwitches` turns a decision into the plan
the loop runs from some step on, in one of two ways:

* **in the open stream** (:meth:`PlanSwitches.defer`), when the engine's stream reads its
  rows from a :class:`~evenflow.plan.feed.PlanFeed`: the feed is held for a moment, the
  processes agree (an all-gather) on the first step none of their pipelines has read yet,
  the feed switches there, and the loop follows when training reaches it
  (:meth:`PlanSwitches.due`, :meth:`PlanSwitches.apply`). Nothing is rebuilt.
* **by reopening** (:meth:`PlanSwitches.adopt`): the loop closes the stream and opens one
  of the new plan at the step it is at (engines without switchable streams).

Either way, a global step holds the same samples under any weights, so exactly once holds
across any number of switches; the monitor, the run's history and the checkpoints (which
carry the weights in use) follow the switch when it takes effect.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.plan.topology import Topology


@dataclass(frozen=True)
class _Pending:
    """A decided re-plan that the open stream switches to at global step ``at``."""

    at: int
    decision: object
    plan: Plan


class PlanSwitches:
    """The plan in use, the decision not applied yet, and the history of re-plans.

    Attributes:
        plan: the plan the loop runs now.
        decided: a monitor decision with new weights, not applied yet (or None).
        history: ``(cursor, weights)`` of every re-plan, at the step it took effect.
    """

    def __init__(self, engine):
        self.engine = engine
        self.plan: Plan | None = None
        self.decided = None
        self.history: list[tuple[Cursor, tuple[float, ...]]] = []
        self._base: Plan | None = None
        self._pending: _Pending | None = None

    def start(self, plan: Plan) -> None:
        """A new ``fit`` from ``plan``."""
        self.plan = self._base = plan
        self.decided = self._pending = None

    def _with(self, weights) -> Plan:
        return self._base.with_topology(Topology(self._base.topology.replicas, weights))

    def defer(self, stream, cursor: Cursor, hooks, all_gather) -> bool:
        """Have the open ``stream`` switch to the decided weights; False if it cannot (then reopen).

        ``all_gather``: the loop's all-gather; every process calls this at the same update (they
        decided alike), so they agree on the switch step.
        """
        feed = getattr(stream, "feed", None)
        if self.decided is None or feed is None:
            return False
        plan = self._with(self.decided.weights)
        first = feed.freeze()
        try:
            at = max(first, cursor.epoch * plan.num_steps + cursor.step)
            at = int(np.max(all_gather(np.array([[float(at)]]))))
            feed.switch(plan, at)
        finally:
            feed.thaw()
        self._pending, self.decided = _Pending(at, self.decided, plan), None
        hooks.monitor.switching()  # its steps until the switch still run the old weights
        return True

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def due(self, global_step: int) -> Cursor | None:
        """The cursor of the pending switch if training has reached it at ``global_step``."""
        if self._pending is None or global_step < self._pending.at:
            return None
        return Cursor(*divmod(self._pending.at, self.plan.num_steps))

    def apply(self, cursor: Cursor, hooks) -> None:
        """The pending switch is in effect from ``cursor``."""
        pending, self._pending = self._pending, None
        self._record(cursor, pending.plan, pending.decision, hooks)

    def drop_pending(self) -> None:
        """Forget a pending switch that training never reached (the run ends before it)."""
        self._pending = None

    def adopt(self, cursor: Cursor, hooks) -> None:
        """Use the decided weights from ``cursor`` on (the loop reopens its stream there)."""
        decision, self.decided = self.decided, None
        self._record(cursor, self._with(decision.weights), decision, hooks)

    def _record(self, cursor: Cursor, plan: Plan, decision, hooks) -> None:
        before = tuple(self.plan.topology.weights or (1.0,) * self.plan.topology.replicas)
        self.plan = plan
        self.history.append((cursor, decision.weights))
        hooks.monitor.replanned(cursor, before, decision)
        if hooks.guard is not None:  # checkpoints from here on carry the new weights
            hooks.guard.weights = tuple(plan.topology.weights)
