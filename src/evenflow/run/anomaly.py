"""The anomaly policy: what a run does about steps with a non-finite loss or gradient.

The trainer skips such a step as a whole (every replica agrees, see
the trainer); this host-side policy then

* logs it to ``<run_dir>/anomalies.jsonl`` — one JSON object per line, with the
  epoch, the step, the ids of the step's samples (from the plan), the *suspects*
  (samples whose own loss was non-finite, from the batches this worker's replicas
  received) and the replicas that saw it;
* counts consecutive anomalous steps; after ``restore_after`` of them the run
  restores its last good checkpoint and multiplies the learning rate by
  ``restore_lr_factor`` (a diverging model, not a bad sample, is the likely cause);
* does not count, while replaying the steps up to where it restored, anomalies
  that come back: steps that fail again after a restore with a lower learning
  rate are bad data, so they are skipped and training goes on;
* gives up after ``max_restores`` restores with :class:`TrainingDiverged`.

Its state (restores done, the replay horizon) travels in the checkpoints, so a
restarted run continues with the same policy state.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.run.options import AnomalyOptions

ANOMALY_LOG = "anomalies.jsonl"


class TrainingDiverged(ValueError):
    """Restoring the last good checkpoint with a lower learning rate did not help."""


class AnomalyPolicy:
    """Counts, logs and answers for non-finite steps.

    Args:
        log_path: the JSON-lines log, or None to keep no log (non-chief workers).
        options: :class:`~evenflow.run.options.AnomalyOptions`: ``restore_after`` (consecutive anomalous
            steps that trigger a restore; 0 never restores), ``restore_lr_factor`` (the learning-rate
            multiplier at each restore) and ``max_restores`` (restores allowed before
            :class:`TrainingDiverged`); None: its defaults.
    """

    def __init__(self, log_path: str | Path | None, options: AnomalyOptions | None = None):
        options = AnomalyOptions() if options is None else options
        if not isinstance(options, AnomalyOptions):
            raise TypeError(f"options must be an evenflow AnomalyOptions, got {type(options).__name__}; e.g. "
                            f"AnomalyPolicy(path, AnomalyOptions(restore_after=3))")
        self.log_path = None if log_path is None else Path(log_path)
        self.restore_after, self.lr_factor = options.restore_after, options.restore_lr_factor
        self.max_restores = options.max_restores
        self.streak = 0   # consecutive anomalous steps that count towards a restore
        self.run = 0      # consecutive anomalous steps, replayed ones included (no checkpoint meanwhile)
        self.anomalies = 0
        self.restores = 0
        self.replay_until: Cursor | None = None
        # Latched when a streak reaches restore_after: the host reads steps a few at a time, and a
        # good step read in the same batch must not erase the verdict before the guard acts on it.
        self.restore_due = False

    # -- per step ---------------------------------------------------------------------------
    def observe(self, epoch: int, step: int, row: dict, step_ids: np.ndarray) -> None:
        """Take in one settled step.

        Args:
            epoch, step: the step (``step`` counted from 0 in the epoch).
            row: the step's outputs as numpy arrays (``flags`` ``[r, 3]``, ``ids`` and
                ``nonfinite`` ``[r, slots]``, ``replica`` ``[r]``) of this worker's replicas.
            step_ids: int64 real ids of the whole step (all replicas), from the plan.
        """
        flags = row["flags"]
        if flags[:, 1].max() <= 0:
            self.streak = self.run = 0
            return
        self.anomalies += 1
        self.run += 1
        after = Cursor(epoch, step + 1)
        replay = self.replay_until is not None and after <= self.replay_until
        if not replay:
            self.streak += 1
            if self.restore_after > 0 and self.streak >= self.restore_after:
                self.restore_due = True
        suspects = row["ids"][row["nonfinite"]] if "nonfinite" in row else np.zeros(0, np.int64)
        self._log({"event": "nonfinite", "epoch": epoch, "step": step, "skipped": bool(flags[:, 2].max() > 0),
                   "replay": replay, "streak": self.streak,
                   "replicas": row["replica"][flags[:, 0] > 0].tolist() if "replica" in row else [],
                   "suspects": np.unique(suspects).tolist(), "ids": np.sort(step_ids).tolist()})

    @property
    def should_restore(self) -> bool:
        """Whether ``restore_after`` consecutive steps were anomalous (outside a replay) since the last restore."""
        return self.restore_due

    # -- restores ----------------------------------------------------------------------------
    def check_can_restore(self, at: Cursor) -> None:
        """Raise :class:`TrainingDiverged` when the restore budget is spent."""
        if self.restores >= self.max_restores:
            raise TrainingDiverged(
                f"{self.restore_after} consecutive non-finite steps up to epoch {at.epoch} step {at.step}, after "
                f"{self.restores} restores with a learning rate lowered each time; the steps and their sample "
                f"ids are in {self.log_path or ANOMALY_LOG}. Lower --learning-rate, check those samples, or "
                f"allow more with --max-restores")

    def restored(self, at: Cursor, to: Cursor, lr_old: float, lr_new: float) -> None:
        """Note a restore done at ``at`` back to checkpoint ``to``."""
        self.restores += 1
        self.streak = self.run = 0
        self.restore_due = False
        self.replay_until = at if self.replay_until is None else max(at, self.replay_until)
        self._log({"event": "restored", "at": at.to_dict(), "to": to.to_dict(), "learning_rate": [lr_old, lr_new],
                   "restores": self.restores})

    # -- persistence --------------------------------------------------------------------------
    def state(self) -> dict:
        return {"restores": self.restores, "anomalies": self.anomalies,
                "replay_until": None if self.replay_until is None else self.replay_until.to_dict()}

    def load_state(self, state: dict | None) -> None:
        state = state or {}
        self.restores = int(state.get("restores", 0))
        self.anomalies = int(state.get("anomalies", 0))
        until = state.get("replay_until")
        self.replay_until = None if until is None else Cursor.from_dict(until)
        self.streak = self.run = 0
        self.restore_due = False

    def _log(self, record: dict) -> None:
        if self.log_path is None:
            return
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
