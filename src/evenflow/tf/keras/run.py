"""The run around ``model.fit``: audit, checkpoints and telemetry as a Keras callback.

:class:`PlanCallback` reads what each step trained on from the exact steps' recorder (sample
ids, ``[loss sum, hits, real count]`` and clock stamps per replica): a
:class:`~evenflow.tf.keras.step_buffer.StepBuffer` on the devices, read back in one transfer
when the rows are needed — at a checkpoint, at the epoch's end, before the buffer can overflow,
and at the first batch end ``READ_SECONDS`` after the last read-back — or a host-side
:class:`~evenflow.tf.keras.recorder.StepRecorder` (emulated slow replicas), read every batch.
It hands the rows, step by step and in order, to the framework-neutral run layer — the same
objects ``evenflow train`` drives. A step's timing row takes its compute time from the recorder's
stamps (inputs there, gradients ready) and its start and end from the host clock around Keras's
batch (``on_train_batch_begin``/``on_train_batch_end``), kept per step until it is read back:

* :class:`~evenflow.run.guard.TrainingGuard`: the audit trail, checkpoints every ``every``
  steps and at each epoch's end (with the cursor, the epoch's sums so far and the weights in
  use), so ``evenflow audit`` checks a ``fit`` run and a rerun resumes exactly;
* :class:`~evenflow.run.monitor.ReplicaMonitor`: ``telemetry.jsonl`` and re-plan decisions
  from the measured per-replica times. A decision takes effect at the next epoch: the callback
  stops ``fit`` at the epoch's end, and :func:`evenflow.tf.fit` continues on the new plan.
"""
from __future__ import annotations

import time

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.run.results import Tally
from evenflow.run.settle import settle_step, speed_decision
from evenflow.tf._lazy import keras as _keras

# The longest the steps' records stay unread on the devices (telemetry.jsonl follows the run this closely).
READ_SECONDS = 2.0


def _rows(records: list[tuple], replicas: list[int]) -> list[dict]:
    """Group recorder records of this worker's ``replicas`` (global ids) into one row per step: each replica's
    j-th record is step j's."""
    by_replica: dict[int, list] = {}
    for rec in records:
        by_replica.setdefault(rec[0], []).append(rec)
    steps = {len(v) for v in by_replica.values()}
    if sorted(by_replica) != list(replicas) or len(steps) != 1:
        raise RuntimeError(f"expected one record per replica and step from replicas {replicas}, got "
                           f"{ {r: len(v) for r, v in sorted(by_replica.items())} }; please report this as a bug")
    rows = []
    for j in range(steps.pop()):
        recs = [by_replica[r][j] for r in replicas]
        rows.append({"replica": np.array(replicas, dtype=np.int64), "ids": np.stack([r[1] for r in recs]),
                     "sums": np.stack([r[2] for r in recs]), "flags": np.zeros((len(replicas), 3)),
                     "stamps": np.stack([r[3] for r in recs])})
    return rows


def plan_callback(base):
    """A :class:`PlanCallback` class deriving from ``keras.callbacks.Callback`` (imported lazily)."""

    class _PlanCallback(PlanCallback, base):
        def __init__(self, *args, **kwargs):
            base.__init__(self)
            PlanCallback.__init__(self, *args, **kwargs)

    return _PlanCallback


class PlanCallback:
    """Feeds each ``fit`` step's records to the guard and the monitor (see the module docstring).

    Create it with :meth:`create` (a ``keras.callbacks.Callback``).

    Args:
        plan: the plan the ``fit`` call runs (possibly re-planned with measured weights).
        base: the run's base plan (what re-plans start from).
        recorder: the :class:`~evenflow.tf.keras.step_buffer.StepBuffer` or
            :class:`~evenflow.tf.keras.recorder.StepRecorder` the exact steps write to.
        start: the cursor the ``fit`` call starts at.
        guard: a :class:`~evenflow.run.guard.TrainingGuard`, or None.
        monitor: a :class:`~evenflow.run.monitor.ReplicaMonitor`, or None.
        workers: the :class:`~evenflow.tf.keras.workers.FitWorkers` of the strategy (this worker's
            replicas and the all-gather), or None: one process with all the plan's replicas.

    Attributes:
        cursor: how far training got.
        replan: new weights decided at an epoch's end (``fit`` was stopped there), or None.
    """

    skip_nonfinite = False  # Keras's fit applies every update

    @classmethod
    def create(cls, *args, **kwargs):
        return plan_callback(_keras().callbacks.Callback)(*args, **kwargs)

    def __init__(self, plan: Plan, base: Plan, recorder, start: Cursor, guard=None, monitor=None, workers=None):
        self.plan, self.base, self.recorder, self.guard, self.monitor = plan, base, recorder, guard, monitor
        self.workers = workers
        self.replicas = list(range(plan.topology.replicas)) if workers is None else workers.replica_ids
        self.cursor, self.replan = start, None
        self._start, self._tally, self._began, self._decided = start, None, 0.0, None
        self._first, self._host, self._read_at = start.step, [], 0.0  # host clock (began, ended) of unread steps

    def all_gather(self, rows) -> np.ndarray:
        """Every worker's rows of ``rows`` (this worker's replicas' rows)."""
        return np.asarray(rows, dtype=np.float64) if self.workers is None else self.workers.all_gather(rows)

    # -- Keras hooks ------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        step = self._start.step if epoch == self._start.epoch else 0
        self.cursor = Cursor(int(epoch), step)
        partial = self.guard.partial(self.cursor) if self.guard is not None else None
        self._tally = Tally(len(self.replicas), partial, per_replica=self.workers is None or self.workers.count == 1)
        self.recorder.drain()
        self._first, self._host, self._read_at = step, [], time.time()

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.time()

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        done = self._first + int(batch) + 1  # the epoch's steps run so far
        self._host.extend([(self._began, now)] * (done - self.cursor.step - len(self._host)))
        if self._read_due(done, now):
            self._read_back()

    def _read_due(self, done: int, now: float) -> bool:
        """Whether the steps up to ``done`` must be read back now: the epoch's end, a checkpoint, a full buffer
        (before the next call of Keras's train function could overflow it), or ``READ_SECONDS`` since the last."""
        every = self.guard.every if self.guard is not None else 0
        room = self.recorder.capacity - (done - self.cursor.step)
        return (done >= self.plan.num_steps or (every > 0 and done // every > self.cursor.step // every)
                or room < max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)
                or now - self._read_at >= READ_SECONDS)

    def _read_back(self) -> None:
        """Hand the steps run since the last read-back to the guard and the monitor, in order."""
        rows = _rows(self.recorder.drain(), self.replicas) if self._host else []
        if len(rows) != len(self._host):
            raise RuntimeError(f"read back {len(rows)} steps of replicas {self.replicas}, expected {len(self._host)}; "
                               f"please report this as a bug")
        for row, (began, now) in zip(rows, self._host):
            stamps = row.pop("stamps")
            ready = float(stamps[:, 0].min())
            row["timing"] = np.column_stack([np.full(len(stamps), min(began, ready)), np.full(len(stamps), ready),
                                             stamps[:, 0], stamps[:, 1], np.full(len(stamps), now)])
            self._step(row)
        self._host, self._read_at = [], time.time()

    def _step(self, row: dict) -> None:
        epoch, step = self.cursor.epoch, self.cursor.step
        settle_step(epoch, step, row, self._tally, self.guard, self.monitor)
        self.cursor = Cursor(epoch, step + 1)
        end = self.cursor.step == self.plan.num_steps
        if self.monitor is not None:
            decision = speed_decision(self.monitor, self.all_gather, end)
            if decision is not None:
                self._decided = decision
        if self.guard is not None:
            if end and self._decided is not None:
                self.guard.weights = tuple(float(w) for w in self._decided.weights)
            result = self._tally.result(epoch, self.all_gather(self._tally.sums)) if end else None
            self.guard.after_step(self, self.cursor, self._tally, result)

    def on_epoch_end(self, epoch, logs=None):
        if self._host:  # training stopped within the epoch (a callback set model.stop_training)
            self._read_back()
        if self.cursor.step == self.plan.num_steps:
            self.cursor = Cursor(int(epoch) + 1, 0)
        if self._decided is not None and self.cursor.step == 0:
            self.replan, self._decided = self._decided, None
            self.model.stop_training = True  # evenflow.tf.fit goes on with the new plan

    def on_train_end(self, logs=None):
        if self.monitor is not None:
            self.monitor.flush()
