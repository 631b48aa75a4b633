"""The rows of a plan, step by step, whose replica weights can change from a later step on.

An input pipeline reads ahead of training: when a run re-plans with measured weights at
step ``s``, the pipelines have already loaded some steps past ``s`` under the old weights.
Rebuilding them costs a pipeline start (a second or more under several workers). A
:class:`PlanFeed` avoids that: the pipelines ask it for the row of each global step as
they reach it, and :meth:`PlanFeed.switch` changes the plan for every step from a given
one on — a step no pipeline has asked for yet.

The switch step must be the same on every process of a job, and past every step any of
their pipelines has read. :meth:`PlanFeed.freeze` holds new requests (a pipeline's threads
wait, ``block=True``; a request from the consumer's own thread would never be answered, so
with ``block=False`` it is an error) and returns the first step this process has not read;
the processes agree on the largest (an all-gather), :meth:`PlanFeed.switch` there, and
:meth:`PlanFeed.thaw` lets the pipelines go on. Between switches the pipelines read ahead
freely, as far as their own buffers let them.

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
# How often a held request re-checks whether the feed or the process is closing, seconds.
_POLL = 0.05


class FeedClosed(RuntimeError):
    """A request reached a feed that was closed (its stream was dropped, or the process exits)."""


class PlanFeed:
    """Serves the rows of global steps ``[first, end)`` of ``plan``; see the module docstring.

    Args:
        plan: the plan in effect from the first step.
        start: the cursor of the first step.
        end_epoch: the epoch to stop before.
        block: whether a request while frozen waits (a pipeline's threads) or raises.
        closing: optional ``fn() -> bool``: True once the process is exiting (a waiting request
            then raises :class:`FeedClosed`).
    """

    def __init__(self, plan: Plan, start: Cursor, end_epoch: int, block: bool = True,
                 closing: Callable[[], bool] | None = None):
        self.steps = plan.num_steps
        self.first = start.epoch * self.steps + start.step
        self.end = int(end_epoch) * self.steps
        self.block = bool(block)
        self._segments: list[tuple[int, Plan]] = [(self.first, plan)]
        self._epochs: OrderedDict[tuple[int, int], EpochPlan] = OrderedDict()
        self._high = self.first - 1         # the highest step served so far
        self._frozen = False
        self._cond = threading.Condition()
        self._planning = threading.Lock()
        self._closed = False
        self._closing = closing

    # -- the consumer's side ------------------------------------------------------------------
    def freeze(self) -> int:
        """Hold every new request; returns the first global step not read yet (a switch may start there)."""
        with self._cond:
            self._frozen = True
            return self._high + 1

    def thaw(self) -> None:
        """Let held requests go on."""
        with self._cond:
            self._frozen = False
            self._cond.notify_all()

    def switch(self, plan: Plan, at: int) -> None:
        """Use ``plan`` (the same steps, other weights) for every step from global step ``at`` on.

        ``at`` must be past every step served so far (see :meth:`freeze`).
        """
        if plan.num_steps != self.steps:
            raise ValueError(f"a switch must keep the plan's {self.steps} steps per epoch, got {plan.num_steps}")
        with self._cond:
            if at <= self._high:
                raise RuntimeError(f"a plan switch at global step {at} comes after step {self._high} was read "
                                   f"under the old plan; please report this as a bug")
            self._segments = [s for s in self._segments if s[0] < at] + [(int(at), plan)]

    def close(self) -> None:
        """Release every waiting request (they raise :class:`FeedClosed`); later requests raise too."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the pipelines' side ------------------------------------------------------------------
    def rows_block(self, g: int, k: int, replicas: int | range | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of steps ``[g, min(g + k, end))`` for ``replicas``, stacked on a leading axis.

        One request for ``k`` steps: they are served together (a switch falls before or after
        them), and a pipeline pays one call into Python per block instead of one per step.
        Rows of different widths (a block across plans of different slots) are padded with -1.
        """
        g, k = int(g), int(k)
        if k < 1:
            raise ValueError(f"a block needs k >= 1 steps, got {k}")
        last = min(g + k, self.end) - 1
        self._check_step(g)
        with self._cond:
            self._wait_for(last)
            self._high = max(self._high, last)
            segments = [(h, *self._segment(h)) for h in range(g, last + 1)]
        whole = replicas is None
        if whole:
            replicas = range(segments[0][2].topology.replicas)
        parts = [self._row(h, begin, plan, replicas) for h, begin, plan in segments]
        width = max(p[0].shape[-1] for p in parts)
        ids = np.stack([np.pad(p[0], [(0, 0)] * (p[0].ndim - 1) + [(0, width - p[0].shape[-1])], constant_values=-1)
                        for p in parts])
        counts, epochs = np.stack([p[1] for p in parts]), np.stack([p[2] for p in parts])
        if whole:
            return ids.reshape(len(parts), -1), counts[:, 0], epochs[:, 0]
        return ids, counts, epochs

    def rows(self, g: int, replicas: int | range | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of step ``g`` for ``replicas``, with the step's global real count and epoch.

        ``replicas``: one replica (ids ``[slots]``, scalar count and epoch), a range of them
        (ids ``[len, slots]``, count and epoch repeated ``[len]``), or None (the whole step,
        ``[replicas * slots]``).
        """
        g = int(g)
        self._check_step(g)
        with self._cond:
            self._wait_for(g)
            self._high = max(self._high, g)
            begin, plan = self._segment(g)
        return self._row(g, begin, plan, replicas)

    def _check_step(self, g: int) -> None:
        if not self.first <= g < self.end:
            raise IndexError(f"global step {g} is outside this feed's steps [{self.first}, {self.end})")

    def _row(self, g: int, begin: int, plan: Plan, replicas: int | range | None):
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
            if not self._frozen or g <= self._high:
                return
            if not self.block:
                raise RuntimeError(f"global step {g} was asked for while the feed was frozen for a switch, from "
                                   f"the thread that switches it; please report this as a bug")
            self._cond.wait(_POLL)

    def _segment(self, g: int) -> tuple[int, Plan]:
        """``(first step, plan)`` of the segment that holds global step ``g`` (the lock held)."""
        return max((seg for seg in self._segments if seg[0] <= g), key=lambda seg: seg[0])

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
