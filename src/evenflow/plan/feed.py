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
:meth:`PlanFeed.thaw` lets the pipelines go on.

How far the pipelines read ahead is how many steps a switch lands after its decision. Left
alone they read as far as their buffers let them (8-10 steps for a ``tf.data`` pipeline with a
prefetch of 4 and blocks of 4 steps): 2-3 s of steps of 0.25 s, run under the old weights after
a device slowed down. A consumer that says where it is (:meth:`PlanFeed.advance`, before each
update) bounds that: for steps of :data:`BOUND_STEP_SECONDS` or more the feed serves steps up
to :data:`LEAD_SECONDS` of training past the consumer's step, at least :data:`MIN_LEAD` steps,
so steps of 0.25 s are read 2 ahead; shorter steps are read as deep as the buffers go. A
consumer that waited for its input (:meth:`PlanFeed.waited`) loosens the bound, and one that
stops reading for :data:`LEAD_PATIENCE` seconds lifts it until its next report.

Whatever the weights, a global step holds the same samples (world-size invariance): a
switch only moves samples between replicas within a step, so every sample of an epoch is
still read exactly once.

Global step ``g`` is ``epoch * plan.num_steps + step``.
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from time import perf_counter as _wall  # how long a request waited (the consumer's pace uses time.monotonic)
from typing import Callable

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import EpochPlan, Plan

# Epoch plans kept per feed: the one being read, the next, and one of an older plan after a switch.
_KEEP = 4
# How often a held request re-checks whether the feed or the process is closing, seconds.
_POLL = 0.05
# Training time the pipelines may read ahead of a consumer that reports its step, and the fewest
# steps: a row needs a step's time to be loaded while the step before it trains, and one more
# covers a load that takes longer once. The bound holds only for steps of BOUND_STEP_SECONDS or
# more: under it a pipeline asks for one step per call (0.2 ms of the GIL each, measured), which
# shorter steps would feel.
LEAD_SECONDS = 0.25
MIN_LEAD = 2
BOUND_STEP_SECONDS = 0.05
# A step that waited this share of a step's time for its input doubles the bound (see waited).
WAIT_SHARE = 0.1
# Intervals between the consumer's reports whose median gives its seconds per step.
_PACE = 8
# A request held by the bound this long (seconds) means the consumer stopped reading for a while (an
# evaluation, a checkpoint, or a stream dropped on an error): the bound lifts until its next report,
# so the pipelines fill their buffers and wait there, in TensorFlow, instead of polling here.
LEAD_PATIENCE = 5.0


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
        paced: the consumer will report its steps (:meth:`advance`): until its pace is known the
            pipelines are served :data:`MIN_LEAD` steps past its step (before its first report,
            past the step before the first), so a re-plan decided in the first steps lands as
            soon as one decided later.
    """

    def __init__(self, plan: Plan, start: Cursor, end_epoch: int, block: bool = True,
                 closing: Callable[[], bool] | None = None, paced: bool = False):
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
        self._reached = self.first - 1   # the last step the consumer reads now (advance)
        self._marks: deque = deque(maxlen=_PACE + 1)  # (clock, step) of its last reports
        self._lead: int | None = MIN_LEAD if paced else None   # steps served past it; None: no bound
        self._floor = 0                  # the least lead, raised when the consumer waited for input
        self._paused = False             # no bound until the consumer's next report (LEAD_PATIENCE)
        self._pace = float("nan")        # its median seconds per step at its last report (NaN: unknown)

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

    def advance(self, g: int) -> None:
        """The consumer reads steps up to global step ``g`` now (call it before each update).

        From its pace (the median seconds per step over its last reports) the feed bounds the
        read-ahead for steps of :data:`BOUND_STEP_SECONDS` or more: a step is served once it is
        at most ``max(MIN_LEAD, ceil(LEAD_SECONDS / pace))`` steps past ``g``. A step that waited
        for its input (:meth:`waited`) doubles that bound for the rest of the feed, so an
        input-bound pipeline is not held back. A feed never told serves as far as its pipelines ask.
        """
        g, now = int(g), time.monotonic()
        with self._cond:
            self._marks.append((now, g))
            self._reached, self._paused = max(self._reached, g), False
            per_step = self._pace = self._per_step()
            if per_step == per_step:  # known
                self._lead = None if per_step < BOUND_STEP_SECONDS else \
                    max(MIN_LEAD, math.ceil(LEAD_SECONDS / per_step), self._floor)
            self._cond.notify_all()

    def waited(self, seconds: float) -> None:
        """The consumer's last update waited ``seconds`` for its input: a wait over
        :data:`WAIT_SHARE` of a step (and 2 ms) doubles the bound on the read-ahead."""
        with self._cond:  # the pace of the last report: only advance() adds to it
            if self._lead is not None and seconds > max(WAIT_SHARE * self._pace, 0.002):
                self._floor = self._lead = min(2 * self._lead, self.end)
                self._cond.notify_all()

    def _per_step(self) -> float:
        """The consumer's median seconds per step over its last reports, NaN before two intervals
        (the lock held)."""
        marks = list(self._marks)
        pace = sorted((t1 - t0) / (g1 - g0) for (t0, g0), (t1, g1) in zip(marks, marks[1:]) if g1 > g0)
        return pace[len(pace) // 2] if len(pace) >= 2 else float("nan")

    @property
    def lead(self) -> int | None:
        """Steps served past the consumer's step; None: no bound (steps under
        :data:`BOUND_STEP_SECONDS`, or a feed not ``paced`` whose consumer's pace is not known)."""
        return self._lead

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
        A consumer's lead (:meth:`advance`) serves fewer: the steps up to ``lead`` past its step
        (at least ``g``, once the consumer is close enough). At the feed's end (``g == end``)
        the block is empty.
        """
        g, k = int(g), int(k)
        if k < 1:
            raise ValueError(f"a block needs k >= 1 steps, got {k}")
        if g == self.end:
            return self._empty(replicas)
        self._check_step(g)
        with self._cond:
            self._wait_for(g)
            # Frozen: only steps already served (a switch may start right after them).
            bound = self._high if self._frozen else max(self._limit(), self._high)
            last = max(g, min(g + k - 1, self.end - 1, bound))
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

    def _limit(self) -> int:
        """The last step served now (the lock held)."""
        return self.end if self._lead is None or self._paused else self._reached + self._lead

    def _empty(self, replicas):
        if replicas is None or isinstance(replicas, int):
            return np.zeros((0, 0), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        n = len(replicas)
        return np.zeros((0, n, 0), np.int64), np.zeros((0, n), np.int64), np.zeros((0, n), np.int64)

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
        held = None
        while True:
            if self._closed or (self._closing is not None and self._closing()):
                raise FeedClosed("this plan feed is closed")
            if g <= self._high or (not self._frozen and g <= self._limit()):
                return
            if not self.block:
                if not self._frozen:
                    raise RuntimeError(f"global step {g} was asked for {g - self._reached} steps past the "
                                       f"consumer's, from the consumer's own thread; call advance() first")
                raise RuntimeError(f"global step {g} was asked for while the feed was frozen for a switch, from "
                                   f"the thread that switches it; please report this as a bug")
            if not self._frozen:  # held by the bound
                now = _wall()
                held = now if held is None else held
                if now - held > LEAD_PATIENCE:
                    self._paused = True
                    continue
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
