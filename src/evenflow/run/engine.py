"""What a framework adapter implements to run the training loop: the :class:`Engine` interface.

:class:`~evenflow.run.loop.TrainLoop` runs epochs, checkpoints, rewinds and re-plans; an
engine runs one optimizer update on this process's replicas, reads that update's outputs
back as numpy, evaluates, and all-gathers small rows between processes.

A step's outputs (:meth:`Engine.read`) are numpy arrays: ``sums`` float ``[r, 3]``,
``flags`` float ``[r, 3]`` (this replica non-finite, the step anomalous on some replica,
the update skipped everywhere), ``ids`` int64 ``[r, slots]``, ``nonfinite`` bool
``[r, slots]`` (suspect samples), ``replica`` int64 ``[r]`` (global replica ids), and on an
update's last step with timing, ``timing`` float64 ``[r, 5]`` (step began, input ready,
replica started, gradients ready, update applied; host clock seconds) — ``r`` being this
process's replicas.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.feed import PlanFeed
from evenflow.plan.plan import Plan


@dataclass
class Stream:
    """An engine's open training stream: its iterator of batches, and the feed its rows come from (or None)."""

    iterator: object
    feed: PlanFeed | None = None


class Engine(Protocol):
    """What a framework adapter implements for :class:`TrainLoop`.

    Attributes:
        local_replicas: replicas this process runs.
        num_processes: processes that hold replicas (workers or ranks); 1 for one process.
        lag: updates the host may read behind the newest dispatched one (0 where a step's
            call returns only once it has run, e.g. on CPUs).
        timing: whether steps carry ``timing`` rows (needed by a monitor).
        skip_nonfinite: whether a non-finite step's update is skipped on every replica.
    """

    local_replicas: int
    num_processes: int
    lag: int
    timing: bool
    skip_nonfinite: bool

    def open(self, reader, plan: Plan, start: Cursor, epochs: int, switchable: bool = False):
        """A stream of the plan's steps from ``start`` through ``epochs`` epochs (from ``start.epoch``).

        ``switchable`` (only asked of engines whose ``can_switch`` is True): return a
        :class:`Stream` whose rows come from a :class:`~evenflow.plan.feed.PlanFeed`, so the
        loop can change the plan's weights without reopening.
        """

    def update(self, stream, global_step: int, count: int, keep_batches: bool) -> tuple[list, list | None]:
        """Run one optimizer update over the next ``count`` plan steps of ``stream``.

        Returns one output handle per plan step (read later by :meth:`read`) and, with
        ``keep_batches``, the batches consumed (for ``on_batch``).
        """

    def read(self, out, with_ids: bool) -> dict:
        """One step's outputs as numpy (see the module docstring); ``ids``/``nonfinite`` only if asked."""

    def sums(self, outs: list):
        """The summed ``[loss sum, hits, real count]`` rows ``[r, 3]`` of an update's outputs (may stay lazy)."""

    def close(self, stream, finished: bool) -> None:
        """Release a stream, read to its end (``finished``) or dropped mid-way (a rewind or re-plan)."""

    def evaluate(self, reader, plan: Plan, epoch: int) -> np.ndarray:
        """float64 ``[r, 3]`` masked sums of epoch ``epoch`` of ``plan`` on this process's replicas."""

    def all_gather(self, rows: np.ndarray) -> np.ndarray:
        """float64 ``[r, k]`` -> ``[R, k]`` in global replica order (a collective across processes)."""
