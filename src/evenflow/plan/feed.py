"""The rows of a plan, step by step, whose replica weights can change from a later step on.

An input pipeline reads ahead of training: when a run re-plans with measured weights at
step ``s``, the pipelines have already loaded some steps past ``s`` under the old weights.
Rebuilding them costs a pipeline start (a second or more under several workers). A
:class:`PlanFeed` avoids that: the pipelines ask it for the row of each global step as
they reach it, and :meth:`PlanFeed.switch` changes the plan for every step from a given
one on — a step no pipeline has asked for yet.

The switch step must be the same on every process of a job, so it cannot depend on how
far each one's pipelines happen to have read. The feed bounds that instead: it serves
step ``g`` only once the consumer has allowed it (:meth:`PlanFeed.allow`, called with the
steps training is about to take), at most ``horizon`` steps ahead. A switch decided when
training is at step ``s`` then takes effect at ``s + horizon`` on every process. With
``block=True`` (a pipeline's own threads ask) a request past the allowed steps waits;
with ``block=False`` (the consumer's thread asks, so waiting would never end) it is an
error, because the reader promised never to run further ahead than ``horizon``.

Whatever the weights, a global step holds the same samples (world-size invariance): a
switch only moves samples between replicas within a step, so every sample of an epoch is
still read exactly once.

Global step ``g`` is ``epoch * plan.num_steps + step``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import EpochPlan, Plan

__all__ = ["PlanFeed", "FeedClosed"]

# Epoch plans kept per feed: the one being read, the next, and one of an older plan after a switch.
_KEEP = 4
# How often a blocked request re-checks whether the feed or the process is closing, seconds.
_POLL = 0.05


class FeedClosed(RuntimeError):
    """A request reached a feed that was closed (its stream was dropped, or the process exits)."""


class PlanFeed:
    """Serves the rows of global steps ``[first, end)`` of ``plan``; see the module docstring.

    Args:
        plan: the plan in effect from the first step.
        start: the cursor of the first step.
        end_epoch: the epoch to stop before.
        horizon: how many steps past the allowed ones a pipeline may read, >= 0.
        block: whether a request past the allowed steps waits (a pipeline's threads) or raises.
        closing: optional ``fn() -> bool``: True once the process is exiting (a blocked request
            then raises :class:`FeedClosed` instead of waiting).
    """

    def __init__(self, plan: Plan, start: Cursor, end_epoch: int, horizon: int, block: bool = True,
                 closing: Callable[[], bool] | None = None):
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
            raise ValueError(f"horizon must be an int >= 0, got {horizon!r}")
        self.steps = plan.num_steps
        self.first = start.epoch * self.steps + start.step
        self.end = int(end_epoch) * self.steps
        self.horizon, self.block = horizon, bool(block)
        self._segments: list[tuple[int, Plan]] = [(self.first, plan)]
        self._epochs: OrderedDict[tuple[int, int], EpochPlan] = OrderedDict()
        self._limit = self.first + horizon  # steps below it may be served
        self._high = self.first - 1         # the highest step served so far
        self._cond = threading.Condition()
        self._planning = threading.Lock()
        self._closed = False
        self._closing = closing

    # -- the consumer's side ------------------------------------------------------------------
    def allow(self, upto: int) -> None:
        """Training is about to take the steps below ``upto``: serve up to ``horizon`` steps past them."""
        with self._cond:
            if upto + self.horizon > self._limit:
                self._limit = upto + self.horizon
                self._cond.notify_all()

    def switch(self, plan: Plan, at: int) -> None:
        """Use ``plan`` (the same steps, other weights) for every step from global step ``at`` on.

        ``at`` must be past every step served so far: the caller passes the step it is at plus
        :attr:`horizon`, which no request can have reached.
        """
        if plan.num_steps != self.steps:
            raise ValueError(f"a switch must keep the plan's {self.steps} steps per epoch, got {plan.num_steps}")
        with self._cond:
            if at <= self._high:
                raise RuntimeError(f"a plan switch at global step {at} comes after step {self._high} was read "
                                   f"under the old plan; please report this as a bug")
            self._segments = [s for s in self._segments if s[0] < at] + [(int(at), plan)]

    def plan_at(self, g: int) -> Plan:
        """The plan in effect at global step ``g``."""
        with self._cond:
            return self._index(g)[1][1]

    def close(self) -> None:
        """Release every waiting request (they raise :class:`FeedClosed`); later requests raise too."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the pipelines' side ------------------------------------------------------------------
    def rows(self, g: int, replicas: int | range | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of step ``g`` for ``replicas``, with the step's global real count and epoch.

        ``replicas``: one replica (ids ``[slots]``, scalar count and epoch), a range of them
        (ids ``[len, slots]``, count and epoch repeated ``[len]``), or None (the whole step,
        ``[replicas * slots]``).
        """
        g = int(g)
        if not self.first <= g < self.end:
            raise IndexError(f"global step {g} is outside this feed's steps [{self.first}, {self.end})")
        with self._cond:
            self._wait_for(g)
            self._high = max(self._high, g)
            _, (begin, plan) = self._index(g)
        epoch, step = divmod(g, self.steps)
        ep = self._epoch_plan(begin, plan, epoch)
        row = ep.ids[step - ep.start_step]
        count = np.int64(ep.global_real_counts[step - ep.start_step])
        if replicas is None:
            return np.ascontiguousarray(row.reshape(-1)), count, np.int64(epoch)
        if isinstance(replicas, range):
            n = len(replicas)
            return (np.ascontiguousarray(row[replicas.start:replicas.stop]), np.full(n, count, np.int64),
                    np.full(n, epoch, np.int64))
        return np.ascontiguousarray(row[int(replicas)]), count, np.int64(epoch)

    def _wait_for(self, g: int) -> None:
        # Called with the lock held.
        while True:
            if self._closed or (self._closing is not None and self._closing()):
                raise FeedClosed("this plan feed is closed")
            if g < self._limit:
                return
            if not self.block:
                raise RuntimeError(f"global step {g} was asked for before training allowed it (steps below "
                                   f"{self._limit}); the reader reads further ahead than the feed's horizon "
                                   f"{self.horizon}; please report this as a bug")
            self._cond.wait(_POLL)

    def _index(self, g: int) -> tuple[int, tuple[int, Plan]]:
        k = max(i for i, (begin, _) in enumerate(self._segments) if begin <= g)
        return k, self._segments[k]

    def _epoch_plan(self, begin: int, plan: Plan, epoch: int) -> EpochPlan:
        # One lock for planning, apart from the one requests wait on: the pipelines of all replicas
        # ask for the same epoch, which is planned once.
        key = (begin, epoch)
        with self._planning:
            ep = self._epochs.get(key)
            if ep is None:
                b_epoch, b_step = divmod(begin, self.steps)
                ep = self._epochs[key] = plan.epoch(epoch, start=Cursor(epoch, b_step) if epoch == b_epoch else None)
                while len(self._epochs) > _KEEP:
                    self._epochs.popitem(last=False)
            return ep
