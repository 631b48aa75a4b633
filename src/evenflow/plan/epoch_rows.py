"""The rows of the plan each replica reads, epoch by epoch, for any framework's input pipeline.

A replica reads row ``ids[:, r, :]`` of each epoch's plan, one step at a time, with the
step's global real count and the epoch alongside. :class:`EpochRows` plans each epoch once
for the pipelines of all replicas and slices it per replica (or per worker, or whole global
steps). A windowed plan's rows for one replica (count mode) or for a worker's range of
replicas (count and cost mode) are planned a window of :data:`WINDOW_SAMPLES` samples at a
time (:func:`replica_windows`), so memory follows the window, not the epoch.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import EpochPlan, Plan
from evenflow.util.validate import check_int

WINDOW_SAMPLES = 1 << 18  # global-step samples per window when replicas' rows are planned alone (at least one step)


def check_epochs(epochs, endless: bool) -> None:
    """``epochs`` to read must be an int >= 0 (or None, an endless stream, where ``endless`` allows it)."""
    if epochs is None and endless:
        return
    check_int("epochs", epochs, 0, fix="or None, an endless stream" if endless else "")


def replica_windows(plan: Plan, epoch: int, first: int, replicas: list[int]):
    """Yield ``(step, rows)`` from step ``first`` of a ``plan.windowed`` plan's ``epoch`` on, a window at a time:
    int64 ``rows [steps, len(replicas), slots]`` from ``step`` on. Count mode (or one replica) computes only those
    replicas' positions; cost mode splits each window's steps whole and keeps the asked replicas."""
    width = max(1, WINDOW_SAMPLES // plan.options.global_batch_size)
    for a in range(first, plan.num_steps, width):
        lo, hi = Cursor(epoch, a), Cursor(epoch, min(a + width, plan.num_steps))
        if plan.options.balance == "count" or len(replicas) == 1:
            yield a, np.stack([plan.replica_ids(epoch, r, start=lo, stop=hi) for r in replicas], axis=1)
        else:
            yield a, plan.epoch(epoch, lo, hi).ids[:, replicas]


class EpochRows:
    """Plans epochs for the pipelines of all replicas, each epoch once.

    Every replica's pipeline asks for its own row of the same epoch; planning once
    and slicing R times keeps a stratified plan of a large dataset from being
    computed R times.
    """

    def __init__(self, plan: Plan, start: Cursor, keep: int = 3):
        self._plan, self._start, self._keep = plan, start, max(keep, 1)
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, EpochPlan] = OrderedDict()

    def epoch_plan(self, epoch: int) -> EpochPlan:
        with self._lock:
            ep = self._cache.get(epoch)
            if ep is None:
                start = self._start if epoch == self._start.epoch else None
                ep = self._cache[epoch] = self._plan.epoch(epoch, start=start)
                while len(self._cache) > self._keep:
                    self._cache.popitem(last=False)
            return ep

    def rows(self, epoch, replica: int | range | None):
        """int64 ids ``[rows, width]`` and global real counts ``[rows]`` of one epoch.

        ``replica`` None: one row of all replicas' slots per step; an int: that
        replica's row per step; a range (a worker's replicas): one row per step and
        replica of the range, step-major, so consecutive rows go to consecutive replicas.
        """
        plan = self._plan
        if replica is not None and plan.windowed and (plan.options.balance == "count" or isinstance(replica, range)):
            return self._window_rows(int(epoch), replica)
        ep = self.epoch_plan(int(epoch))
        counts = ep.global_real_counts.astype(np.int64)
        if replica is None:
            ids = ep.ids.reshape(ep.num_steps, ep.ids.shape[1] * ep.ids.shape[2])
        elif isinstance(replica, range):
            ids = ep.ids[:, replica.start:replica.stop, :].reshape(-1, ep.ids.shape[2])
            counts = np.repeat(counts, len(replica))
        else:
            ids = ep.ids[:, replica, :]
        return np.ascontiguousarray(ids, dtype=np.int64), counts

    def _window_rows(self, epoch: int, replica: int | range):
        # Single replicas of a cost plan share the whole epoch instead (see rows); a worker's range
        # asks once per epoch, so no window is planned twice.
        plan = self._plan
        first = self._start.step if epoch == self._start.epoch else 0
        wanted = [replica] if isinstance(replica, int) else list(replica)
        parts = [rows.reshape(-1, plan.slots) for _, rows in replica_windows(plan, epoch, first, wanted)]
        ids = np.concatenate(parts) if parts else np.zeros((0, plan.slots), np.int64)
        counts = np.repeat(plan.step_sizes[first:], len(wanted))
        return np.ascontiguousarray(ids, dtype=np.int64), counts

    def columns(self, epochs: range, replica: int | range | None) -> dict:
        """The rows of several epochs back to back, with an ``epoch`` column."""
        parts = [(e, *self.rows(e, replica)) for e in epochs]
        width = self._plan.slots * (self._plan.topology.replicas if replica is None else 1)
        return {"id": np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, width), np.int64),
                "global_real_count": np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64),
                "epoch": np.concatenate([np.full(len(p[2]), p[0], np.int64) for p in parts]) if parts
                else np.zeros(0, np.int64)}
