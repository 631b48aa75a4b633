"""The per-step policy of a fault-tolerant run: checkpoints, audit trail, anomaly recovery.

:class:`TrainingGuard` is what the training loop (:class:`~evenflow.run.loop.TrainLoop`,
behind both frameworks' ``Trainer.fit``) calls after every step when given ``guard=``. It

* hands each settled step to the :class:`~evenflow.run.audit.AuditLog` and the
  :class:`~evenflow.run.anomaly.AnomalyPolicy`;
* saves a checkpoint every ``every`` steps and at the end of each epoch (the
  audit rows first, then the checkpoint that covers them), except while a run of
  non-finite steps is in progress, so the last checkpoint is always a good one;
* confirms a checkpoint once training went on from it for ``restore_after`` steps
  without a non-finite one (a finite model whose weights already blew up is not a good
  one to return to);
* when the anomaly policy asks for it, restores the newest confirmed checkpoint,
  lowers the learning rate and tells the trainer to rewind to that checkpoint's cursor;
* on start (:meth:`resume`), restores the newest checkpoint of the run directory
  that can be restored (skipping, with a warning, any whose digests do not match or
  that the framework cannot load) and trims the audit trail back to it.

A checkpoint's ``meta.json`` carries what a restarted run needs besides the
variables: the cursor, the completed epochs' results (``history``), the sums of
the current epoch so far (``partial``), the anomaly policy's state, and the plan's
fingerprint (checked on resume: a run directory only resumes the same plan).
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.plan.topology import Topology
from evenflow.run.anomaly import AnomalyPolicy
from evenflow.run.audit import AuditLog
from evenflow.run.checkpoints import (Checkpointer, CheckpointInfo, NonFiniteModelError, fault_point,
                                      list_checkpoints)
from evenflow.util.validate import check_int


class TrainingGuard:
    """Checkpoints, audit and anomaly recovery for one run.

    Args:
        plan: the training plan (for its fingerprint and the ids of anomalous steps).
        checkpointer: a :class:`~evenflow.run.checkpoints.Checkpointer`.
        every: checkpoint every this many steps of an epoch (0: only at epoch ends).
        audit: an :class:`~evenflow.run.audit.AuditLog`, or None.
        anomalies: an :class:`~evenflow.run.anomaly.AnomalyPolicy`, or None.
        is_chief: True on the worker that trims the audit trail of all workers.
    """

    def __init__(self, plan: Plan, checkpointer: Checkpointer, every: int = 0, audit: AuditLog | None = None,
                 anomalies: AnomalyPolicy | None = None, is_chief: bool = True):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
        if not isinstance(checkpointer, Checkpointer):
            raise TypeError(f"checkpointer must be an evenflow.run.Checkpointer, got {type(checkpointer).__name__}")
        every = check_int("every", every, 0, fix="steps between checkpoints; 0: epoch ends only")
        self.plan, self.checkpointer, self.every = plan, checkpointer, every
        self.audit, self.anomalies, self.is_chief = audit, anomalies, is_chief
        self.history: list[dict] = []
        # Facts every checkpoint's meta.json carries (e.g. the framework that wrote it).
        self.meta: dict = {}
        # Replica weights in use when they differ from the plan's (measured speeds; see
        # Trainer.fit's re-plans): saved with each checkpoint, so a resumed run starts from them.
        self.weights: tuple[float, ...] | None = None
        self.saved: CheckpointInfo | None = None
        self.needs_ids = True
        self._partial: tuple[Cursor, dict] | None = None
        self._epoch_ids: tuple[int, np.ndarray] | None = None
        self._prev: Cursor | None = None
        # The checkpoint an anomaly goes back to, and the one waiting for clean steps to become it.
        self.confirmed: Cursor | None = None
        self._unconfirmed: list | None = None  # [cursor, clean steps since]
        self._confirm_after = max(anomalies.restore_after, 1) if anomalies is not None else 1

    # -- start -----------------------------------------------------------------------------------
    @classmethod
    def in_run_dir(cls, run_dir, plan: Plan, state, *, keep: int, every: int, audit: bool,
                   meta: dict | None = None, anomalies: AnomalyPolicy | None = None, is_chief: bool = True,
                   worker: int = 0, background: bool = False) -> "TrainingGuard":
        """The guard of a run directory: ``keep`` checkpoints of ``state`` (a ModelState), the audit trail when
        ``audit``, and ``meta`` in every checkpoint's meta.json; ``background``: the
        :class:`~evenflow.run.checkpoints.Checkpointer` makes each save durable in a thread."""
        checkpointer = Checkpointer(run_dir, state, keep=keep, is_chief=is_chief, worker=worker, background=background)
        log = AuditLog(run_dir, plan.index.num_samples, plan.num_steps, plan.topology.replicas, worker=worker) \
            if audit else None
        guard = cls(plan, checkpointer, every=every, audit=log, anomalies=anomalies, is_chief=is_chief)
        guard.meta = dict(meta or {})
        return guard

    def plan_in_use(self) -> Plan:
        """The plan split by the replica weights in use (a checkpoint's measured ones), else the plan itself."""
        return self.plan if self.weights is None else \
            self.plan.with_topology(Topology(self.plan.topology.replicas, self.weights))

    def resume(self, candidates: list[CheckpointInfo] | None = None, agree=None) -> Cursor | None:
        """Restore the newest checkpoint that loads (if any) and trim the audit to it; returns its cursor.

        ``candidates`` and ``agree`` are :meth:`Checkpointer.restore_latest`'s. Raises
        ``ValueError`` when checkpoints exist but none can be restored.
        """
        info = self.checkpointer.restore_latest(candidates, agree)
        if info is None:
            self.confirmed = None
            if self.audit is not None and self.is_chief:
                self.audit.trim(Cursor(0, 0))
            return None
        found = [c for c in list_checkpoints(self.checkpointer.run_dir)
                 if c.confirmed and c.cursor <= info.cursor and c.path not in self.checkpointer.unreadable]
        self.confirmed = found[-1].cursor if found else None
        self._adopt(info)
        if not info.confirmed:
            self._unconfirmed = [info.cursor, 0]
        if self.anomalies is not None:
            self.anomalies.load_state(info.meta.get("anomaly"))
        return info.cursor

    def save_initial(self, cursor: Cursor) -> None:
        """Checkpoint the untrained model, so an anomaly always has a good state to return to."""
        self._save(cursor, partial=None)
        self._confirm()

    def _adopt(self, info: CheckpointInfo) -> None:
        self.saved = info
        self.history = list(info.meta.get("history", []))
        weights = info.meta.get("weights")
        # Weights for another number of replicas (an elastic restart) are dropped: measured again.
        self.weights = tuple(float(w) for w in weights) if weights and len(weights) == self.plan.topology.replicas \
            else None
        partial = info.meta.get("partial")
        self._partial = (info.cursor, partial) if partial else None
        if self.audit is not None:
            self.audit.drop_pending()
            if self.is_chief:
                self.audit.trim(info.cursor)

    def partial(self, cursor: Cursor) -> dict | None:
        """The epoch sums stored with the checkpoint at ``cursor`` (to finish that epoch's figures)."""
        if self._partial is not None and self._partial[0] == cursor:
            return self._partial[1]
        return None

    # -- per step (called by Trainer.fit) -------------------------------------------------------
    def due(self, cursor: Cursor) -> bool:
        """Whether the update that ended at ``cursor`` crossed a multiple of ``every`` steps.

        (An update covers several plan steps under gradient accumulation.)
        """
        prev, self._prev = self._prev, cursor
        if self.every <= 0:
            return False
        before = prev.step if prev is not None and prev.epoch == cursor.epoch and prev < cursor else cursor.step - 1
        return cursor.step // self.every > before // self.every

    def record(self, epoch: int, step: int, row: dict) -> None:
        """Take in one settled step's outputs (numpy)."""
        if self.audit is not None:
            self.audit.record(epoch, step, row["replica"], row["ids"], bool(row["flags"][:, 2].max() > 0))
        anomalous = bool(row["flags"][:, 1].max() > 0)
        if self.anomalies is not None:
            self.anomalies.observe(epoch, step, row, self._step_ids(epoch, step) if anomalous else None)
        if self._unconfirmed is not None:
            if anomalous:
                self._unconfirmed = None
            else:
                self._unconfirmed[1] += 1
                if self._unconfirmed[1] >= self._confirm_after:
                    self._confirm()

    def _confirm(self) -> None:
        cursor = self._unconfirmed[0] if self._unconfirmed is not None else self.saved.cursor
        self.checkpointer.confirm(cursor)
        self.confirmed, self._unconfirmed = cursor, None

    def _step_ids(self, epoch: int, step: int) -> np.ndarray:
        if self._epoch_ids is None or self._epoch_ids[0] != epoch:
            self._epoch_ids = (epoch, self.plan.epoch(epoch).ids)
        ids = self._epoch_ids[1][step]
        return ids[ids >= 0]

    def after_step(self, loop, cursor: Cursor, tally, result) -> Cursor | None:
        """Checkpoint or rewind after the step that ended at ``cursor``; returns a cursor to rewind to.

        ``loop`` is the :class:`~evenflow.run.loop.TrainLoop` (for its all-gather and its
        ``skip_nonfinite``); ``result`` the :class:`~evenflow.run.results.EpochResult` when the
        step ended the epoch.
        """
        fault_point("step")
        if self.anomalies is not None and self.anomalies.should_restore:
            return self.rewind(cursor)
        end = result is not None
        if end:
            self.history.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(result).items()})
        if not (end or self.due(cursor)):
            return None
        if self.anomalies is not None and self.anomalies.run > 0:
            return None  # in the middle of non-finite steps: keep the last good checkpoint as it is
        saved_at = Cursor(cursor.epoch + 1, 0) if end else cursor
        # Mid-epoch, the epoch's sums so far go with the checkpoint: all workers' (a collective, which
        # every worker reaches here at the same step, since all of them save at the same steps).
        partial = None if end else tally.to_dict(loop.all_gather(tally.sums))
        try:
            self._save(saved_at, partial=partial)
        except NonFiniteModelError:
            if self.anomalies is None or not loop.skip_nonfinite:
                raise
            # Finite gradients pushed a weight to Inf: as bad as a non-finite step.
            return self.rewind(cursor)
        return None

    def finish(self, cursor: Cursor) -> None:
        """At the end of training: save the final state if its epoch-end save was put off; return once every save
        is durable."""
        if self.saved is None or self.saved.cursor != cursor:
            self._save(cursor, partial=None)
        self.checkpointer.wait()

    def _save(self, cursor: Cursor, partial: dict | None) -> None:
        if self.audit is not None:
            self.audit.flush()  # before the checkpoint: a crash in between is trimmed on resume
        extra = {**self.meta, "plan": self.plan.fingerprint(), "replicas": self.plan.topology.replicas,
                 "history": self.history, "partial": partial,
                 "weights": None if self.weights is None else [float(w) for w in self.weights],
                 "anomaly": self.anomalies.state() if self.anomalies is not None else None}
        path = self.checkpointer.save(cursor, extra)
        self.saved = CheckpointInfo(path, cursor, extra)
        self._unconfirmed = [cursor, 0]

    # -- recovery --------------------------------------------------------------------------------
    def rewind(self, at: Cursor) -> Cursor:
        """Restore the newest confirmed checkpoint, lower the learning rate; returns the cursor to go on from."""
        policy = self.anomalies
        policy.check_can_restore(at)
        self.checkpointer.wait()  # the newest save is listed once it is durable
        found = [c for c in list_checkpoints(self.checkpointer.run_dir) if c.path not in self.checkpointer.unreadable]
        if not found:
            raise RuntimeError("no checkpoint to restore after non-finite steps; please report this as a bug")
        # The confirmed one (pruning keeps it), else the oldest there is.
        good = [c for c in found if c.cursor == self.confirmed] or [c for c in found if c.confirmed][-1:]
        info = good[-1] if good else found[0]
        state = self.checkpointer.state
        lr_old = float(state.learning_rate)
        self.checkpointer.restore(info)
        # From the rate in use, not the checkpoint's: restoring the same checkpoint twice lowers it twice.
        lr_new = min(lr_old, float(state.learning_rate)) * policy.lr_factor
        state.learning_rate = lr_new
        self._adopt(info)
        self._unconfirmed = None
        self._prev = None
        policy.restored(at, info.cursor, lr_old, lr_new)
        print(f"{policy.restore_after} consecutive non-finite steps up to epoch {at.epoch} step {at.step}: restored "
              f"the checkpoint at epoch {info.cursor.epoch} step {info.cursor.step}, learning rate {lr_old:g} -> "
              f"{lr_new:g}", file=sys.stderr, flush=True)
        return info.cursor
