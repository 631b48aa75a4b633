"""The framework-neutral training loop: epochs of plan steps, checkpoints, rewinds and re-plans.

:class:`TrainLoop` runs a :class:`~evenflow.plan.plan.Plan` for a number of epochs, possibly
from a :class:`~evenflow.plan.cursor.Cursor` in the middle of one, through an
:class:`Engine`: the small interface a framework adapter implements to run one optimizer
update on its replicas, read that update's outputs back as numpy, evaluate, and all-gather
small rows between processes. Everything else is here, once, for every framework:

* updates of ``accumulate_steps`` plan steps, grouped from multiples of k within an epoch
  (a run resumed at a group boundary groups its steps as an uninterrupted one does);
* step outputs read back ``engine.lag`` updates late (all of them before a checkpoint);
* the :class:`~evenflow.run.guard.TrainingGuard` after every update (checkpoints, audit,
  anomaly restores, which rewind the loop to a checkpoint's cursor);
* the :class:`~evenflow.run.monitor.ReplicaMonitor`: per-replica timings all-gathered every
  few updates, and re-plans with measured weights, decided alike on every process and
  switched to in the open stream (:mod:`evenflow.run.replans`);
* exact epoch figures: per-replica ``[loss sum, hits, real count]`` gathered once per epoch.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.run.engine import Engine
from evenflow.run.hooks import Hooks as _Hooks
from evenflow.run.partial_eval import warn_if_partial
from evenflow.run.replans import PlanSwitches
from evenflow.run.results import EpochResult, EvalResult, Tally
from evenflow.run.same_plan import check_same_plan
from evenflow.run.settle import settle_step, speed_decision
from evenflow.util.validate import check_accumulate_steps, check_int

# Most plan slots (ids) one training stream holds: 2**23 int64 ids = 64 MiB of host memory.
CHUNK_SLOTS = 2**23


@dataclass(frozen=True)
class _Replan:
    """The epoch stops at ``cursor`` to continue under new weights, with its running ``tally``."""

    cursor: Cursor
    tally: Tally | None


class TrainLoop:
    """Trains through an :class:`Engine` from epoch plans; holds the plan in use and the cursor.

    Args:
        engine: the framework adapter's :class:`Engine`.
        accumulate_steps: plan steps per optimizer update, in ``[1, 64]``.

    Attributes:
        plan: the plan :meth:`fit` runs now (the one passed in, or a re-plan with measured weights).
        cursor: how far training got (what a checkpoint stores).
        replans: ``(cursor, weights)`` of every re-plan.
    """

    def __init__(self, engine: Engine, accumulate_steps: int):
        check_accumulate_steps(accumulate_steps)
        self.engine, self.accumulate_steps = engine, int(accumulate_steps)
        self.switches = PlanSwitches(engine)
        self.cursor: Cursor | None = None

    @property
    def plan(self) -> Plan | None:
        """The plan :meth:`fit` runs now (the one passed in, or a re-plan with measured weights)."""
        return self.switches.plan

    @property
    def replans(self) -> list[tuple[Cursor, tuple[float, ...]]]:
        """``(cursor, weights)`` of every re-plan."""
        return self.switches.history

    @property
    def skip_nonfinite(self) -> bool:
        return self.engine.skip_nonfinite

    def all_gather(self, rows: np.ndarray) -> np.ndarray:
        """Every process's rows (a collective); a single process gets its rows back unchanged."""
        if self.engine.num_processes == 1:
            return np.asarray(rows, dtype=np.float64)
        return self.engine.all_gather(np.asarray(rows, dtype=np.float64))

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, reader, plan: Plan, epochs: int, start: Cursor | None = None, on_step: Callable | None = None,
            on_epoch: Callable | None = None, on_batch: Callable | None = None, guard=None,
            monitor=None) -> list[EpochResult]:
        """Train from ``start`` (default the beginning) up to the end of epoch ``epochs - 1``.

        Args:
            reader: what the engine reads batches with (the framework's reader of the training set).
            plan: the training plan; its replicas must match the engine's.
            epochs: the epoch to stop before (like Keras's ``epochs``), > ``start.epoch``.
            start: the cursor to resume from.
            on_step: optional ``fn(cursor, sums)`` after each update; ``sums`` ``[r, 3]``
                (see :meth:`Engine.sums`; reading it may wait for the step).
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch.
            on_batch: optional ``fn(cursor, batch)`` with the batch each plan step consumed.
            guard: optional :class:`~evenflow.run.guard.TrainingGuard`.
            monitor: optional :class:`~evenflow.run.monitor.ReplicaMonitor` (needs timing).

        Returns:
            One :class:`EpochResult` per epoch run (after a rewind, the epochs run last).
        """
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor, got {type(start).__name__}")
        epochs = check_int("epochs", epochs, start.epoch + 1, fix=f"the epoch to stop before, after the start epoch "
                           f"{start.epoch}")
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
        if monitor is not None and not self.engine.timing:
            raise ValueError("a monitor needs per-replica timings: create the trainer with timing=True")
        if monitor is not None and not plan.topology.is_uniform and monitor.weights != plan.topology.weights:
            monitor.rebalancer.weights = tuple(float(w) for w in plan.topology.weights)
        check_same_plan(plan, self.all_gather, self.engine.local_replicas, self.engine.num_processes, reader)
        if start.step > plan.num_steps:
            raise ValueError(f"start {start} is past the end of an epoch of {plan.num_steps} steps; resume from a "
                             f"cursor of this plan (trainer.cursor, or a checkpoint's)")
        if start.step == plan.num_steps:  # the end of an epoch (what ``cursor`` holds after one) is the next one's start
            start = Cursor(start.epoch + 1, 0)
        self.switches.start(plan)
        if monitor is not None:  # a re-plan must pay for itself over the steps left
            monitor.total_steps = epochs * plan.num_steps
        hooks = _Hooks(on_step, on_epoch, on_batch, guard, monitor)
        results: list[EpochResult] = []
        cursor, carry = start, None
        while cursor.epoch < epochs:
            cursor, carry = self._run_stream(reader, cursor, epochs, carry, hooks, results)
        if guard is not None:
            guard.finish(cursor)
        return results

    def _run_stream(self, reader, cursor: Cursor, epochs: int, carry, hooks, results):
        # Epochs are read in streams of at most CHUNK_SLOTS planned ids: all of a small dataset's
        # epochs in one stream, one epoch per stream for a large one.
        per_epoch = max(self.plan.num_steps * self.plan.topology.replicas * self.plan.slots, 1)
        last = min(cursor.epoch + max(1, CHUNK_SLOTS // per_epoch), epochs)
        opened = time.perf_counter()
        # With rebalancing on, a stream that switches its plan mid-way saves a rebuild per re-plan.
        switchable = hooks.monitor is not None and hooks.monitor.rebalancing \
            and getattr(self.engine, "can_switch", False)
        stream = self.engine.open(reader, self.plan, cursor, last - cursor.epoch,
                                  **({"switchable": True} if switchable else {}))
        if hooks.monitor is not None and hooks.monitor.global_step == 0:
            # Switchable streams too: until a switch is measured, this stands in for a re-plan's cost
            # (noise on short steps then starts no re-plan that a few ms seem to pay for).
            hooks.monitor.stream_opened(time.perf_counter() - opened)
        for epoch in range(cursor.epoch, last):
            first = cursor.step if epoch == cursor.epoch else 0
            outcome = self._run_epoch(stream, epoch, first, hooks, carry)
            carry = None
            if isinstance(outcome, Cursor):  # rewound by the guard
                self.engine.close(stream, finished=False)
                if self.switches.pending:  # the stream is reopened anyway: under the new weights
                    self.switches.apply(outcome, hooks)
                del results[len([r for r in results if r.epoch < outcome.epoch]):]
                self.cursor = outcome
                return outcome, None
            if isinstance(outcome, _Replan):
                self.engine.close(stream, finished=False)
                self.switches.adopt(outcome.cursor, hooks)
                return outcome.cursor, outcome.tally
            results.append(outcome)
            if hooks.on_epoch is not None:
                hooks.on_epoch(outcome)
            if self.switches.decided is not None and epoch + 1 < epochs:  # decided at the epoch's end
                if self.switches.defer(stream, Cursor(epoch + 1, 0), hooks, self.all_gather):
                    continue
                self.engine.close(stream, finished=False)
                self.switches.adopt(Cursor(epoch + 1, 0), hooks)
                return Cursor(epoch + 1, 0), None
            self.switches.decided = None
        self.engine.close(stream, finished=True)
        if self.switches.pending:  # due past this stream's end: the next stream starts with it
            if last < epochs:
                self.switches.apply(Cursor(last, 0), hooks)
            self.switches.drop_pending()
        return Cursor(last, 0), None

    # -- one epoch ------------------------------------------------------------------------------
    def _run_epoch(self, stream, epoch: int, first: int, hooks: "_Hooks", tally: Tally | None = None):
        """Run steps ``first..`` of ``epoch``: an :class:`EpochResult`, a Cursor to rewind to, or a :class:`_Replan`."""
        plan, engine, guard, monitor = self.plan, self.engine, hooks.guard, hooks.monitor
        if tally is None:
            tally = Tally(engine.local_replicas, guard.partial(Cursor(epoch, first)) if guard is not None else None,
                          per_replica=engine.num_processes == 1)
        pending: deque = deque()
        self.cursor = Cursor(epoch, first)
        k, step = self.accumulate_steps, first
        while step < plan.num_steps:
            # One update: the steps up to the next multiple of k (fewer at the epoch's end).
            count = min(k - step % k, plan.num_steps - step)
            outs, batches = engine.update(stream, epoch * plan.num_steps + step, count, hooks.on_batch is not None)
            for i, out in enumerate(outs):
                pending.append((step + i, out))
                if batches is not None:
                    hooks.on_batch(Cursor(epoch, step + i + 1), batches[i])
            step += count
            self.cursor = Cursor(epoch, step)
            switched = self.switches.due(epoch * plan.num_steps + step)
            if switched is not None:
                self.switches.apply(switched, hooks)
            if hooks.on_step is not None:
                hooks.on_step(self.cursor, engine.sums(outs))
            if guard is None and monitor is None:
                continue
            outcome = self._after_update(pending, tally, epoch, step == plan.num_steps, hooks)
            if isinstance(outcome, _Replan) and self.switches.defer(stream, self.cursor, hooks, self.all_gather):
                continue
            if outcome is not None:
                return outcome
        self._settle(pending, tally, epoch, 0, hooks)
        if monitor is not None:
            self._check_speeds(monitor, True)
        return self._result(epoch, tally)

    def _after_update(self, pending: deque, tally: Tally, epoch: int, end: bool, hooks: "_Hooks"):
        guard, monitor = hooks.guard, hooks.monitor
        due = end or (guard is not None and guard.due(self.cursor))
        self._settle(pending, tally, epoch, 0 if due else self.engine.lag, hooks)
        if monitor is not None:
            self._check_speeds(monitor, end)
        if guard is not None and end and self.switches.decided is not None:
            # Decided at the epoch's end: the next epoch runs with these weights, so the checkpoint that
            # resumes there carries them (a resumed run starts from them instead of measuring again).
            guard.weights = tuple(float(w) for w in self.switches.decided.weights)
        if guard is not None:
            rewind = guard.after_step(self, self.cursor, tally, self._result(epoch, tally) if end else None)
            if rewind is not None:
                self.switches.decided = None
                if monitor is not None:
                    monitor.drop()
                return rewind
        if self.switches.decided is not None and not end:
            # Every process decided the same at the same update (same gathered numbers).
            self._settle(pending, tally, epoch, 0, hooks)
            self._check_speeds(monitor, True)  # logs the steps settled just now (in cool-down: no decision)
            return _Replan(self.cursor, tally)
        return None

    def _check_speeds(self, monitor, end_of_epoch: bool) -> None:
        """Gather the monitor's window across processes when due; keep a decision with new weights."""
        decision = speed_decision(monitor, self.all_gather, end_of_epoch)
        if decision is not None:
            self.switches.decided = decision

    def _settle(self, pending: deque, tally: Tally, epoch: int, keep: int, hooks: "_Hooks") -> None:
        # Read back all but the last `keep` step outputs (waits for those steps to finish).
        guard, monitor = hooks.guard, hooks.monitor
        with_ids = (guard is not None and guard.needs_ids) or (monitor is not None and monitor.needs_ids)
        while len(pending) > keep:
            step, out = pending.popleft()
            settle_step(epoch, step, self.engine.read(out, with_ids), tally, guard, monitor)

    def _result(self, epoch: int, tally: Tally) -> EpochResult:
        # Under several processes the per-replica sums are all-gathered, once per tally state: every
        # process calls this at its epoch's end whether or not it also did for a guard.
        if tally.gathered is None or tally.gathered[0] != tally.steps:
            tally.gathered = (tally.steps, self.all_gather(tally.sums))
        return tally.result(epoch, tally.gathered[1])

    # -- evaluation ---------------------------------------------------------------------------------
    def evaluate(self, reader, plan: Plan, epoch: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set).

        Every sample the plan reads is counted exactly once, whatever the replicas: the whole index,
        but for the remainder a ``drop_remainder`` plan drops (with a warning).
        """
        check_same_plan(plan, self.all_gather, self.engine.local_replicas, self.engine.num_processes, reader)
        warn_if_partial(plan)
        local = self.engine.evaluate(reader, plan, epoch)
        return EvalResult.from_sums(self.all_gather(local).sum(axis=0))


class LoopFront:
    """What both frameworks' ``Trainer`` show of their :class:`TrainLoop` (``self.loop``)."""

    loop: TrainLoop

    @property
    def plan(self) -> Plan | None:
        """The plan ``fit`` runs now: the one passed in, or a re-plan with measured weights."""
        return self.loop.plan

    @property
    def replans(self) -> list:
        """``(cursor, weights)`` of every re-plan."""
        return self.loop.replans

    @property
    def cursor(self) -> Cursor | None:
        """How far training got."""
        return self.loop.cursor
