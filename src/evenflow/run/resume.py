"""What a resumed run takes from its checkpoint, and which of its own flags it can honour (numpy only).

Before a framework starts, :func:`resumable` lists the run directory's checkpoints up to the
newest whose digests match, and :func:`check_resume` refuses a checkpoint of other data, another
plan or framework, or another model, dropout or optimizer (a resume continues the checkpoint's
model and optimizer), naming the flag. The rules every front end shares (:func:`check_same_run`,
:func:`check_epochs_trained`) name its options through its :class:`ResumeWords`. After the restore, :func:`learning_rate_note` honours a
changed ``--learning-rate`` and :func:`audit_note` says what a changed ``--audit`` leaves out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.run.checkpoints import CheckpointInfo, list_checkpoints, none_restorable, verify
from evenflow.run.config import TrainConfig
from evenflow.run.guard import TrainingGuard


def resumable(run_dir: Path) -> tuple[CheckpointInfo, ...]:
    """The run directory's checkpoints, oldest first, up to the newest whose digests match (numpy only).

    The unreadable ones after it stay in the list, with their ``problem``, for the resume to warn
    about. Raises ``ValueError`` naming them when checkpoints exist but none can be restored.
    """
    found = list_checkpoints(run_dir, unreadable=True)
    for i in range(len(found) - 1, -1, -1):
        found[i] = verify(found[i])
        if found[i].problem is None:
            return tuple(found)
    if found:
        raise ValueError(none_restorable(run_dir, found))
    return ()


# Flags a resume cannot honour: the checkpoint's model and optimizer are what training continues.
_KEPT = (("model", "--model", lambda c: c.model.model), ("dropout", "--dropout", lambda c: c.model.dropout),
         ("optimizer", "--optimizer", lambda c: c.optimizer.optimizer))


def run_facts(config: TrainConfig) -> dict:
    """What every checkpoint's meta.json records of the run's configuration (checked on resume)."""
    return {**{key: get(config) for key, _, get in _KEPT}, "learning_rate": config.optimizer.learning_rate,
            "audit": config.checkpoint.audit}


def audit_note(cfg: TrainConfig, guard: TrainingGuard, start: Cursor) -> str | None:
    """A line when ``--audit`` differs from the checkpoint's run: the trail then misses some steps."""
    before = (guard.saved.meta.get("config") or {}).get("audit")
    if before is None or before == cfg.checkpoint.audit:
        return None
    at = f"epoch {start.epoch} step {start.step}"
    if cfg.checkpoint.audit:
        return (f"audit trail from {at} on: the steps before it were trained without --audit, so evenflow audit "
                f"counts them as not recorded")
    return (f"no audit trail from {at} on: the checkpoint's run had --audit and this one has not, so evenflow "
            f"audit counts these steps as not recorded")


@dataclass(frozen=True)
class ResumeWords:
    """How a front end names its options in the lines that refuse a resume (:data:`COMMAND`: ``evenflow train``'s).

    ``data`` is what a data digest covers (after a colon, or ""), ``plan`` what a plan fingerprint
    covers; ``epochs`` the epochs option as written before its value.
    """

    output_dir: str
    this: str
    data: str
    plan: str
    epochs: str
    start_over: str


COMMAND = ResumeWords("--output-dir", "this run", ": the dataset's content, its feature or label key, the per-sample "
                      "shape, the held-out split or the evaluation dataset differ",
                      "the dataset, global batch size, seed, stratification", "--epochs ",
                      "--no-resume to start over there")


def check_same_run(candidates: tuple[CheckpointInfo, ...], plan: Plan, identity: str | None, run_dir: Path,
                   words: ResumeWords, api: str | None = None) -> CheckpointInfo:
    """The newest verified of :func:`resumable`'s ``candidates``, unless it is of another kind of run (``api``),
    of other data or of another plan (numpy only)."""
    latest = next(c for c in reversed(candidates) if c.verified)
    meta = latest.meta
    if meta.get("api") != api:
        raise ValueError(f"output_dir {run_dir} holds checkpoints of another kind of run ({meta.get('api') or 'evenflow'}"
                         f" {meta.get('framework', '')}); use another {words.output_dir}")
    theirs = meta.get("data")
    if identity is not None and theirs is not None and theirs != identity:
        raise ValueError(f"output_dir {run_dir} holds checkpoints trained on other data (data digest {theirs[:12]}, "
                         f"{words.this}'s {identity[:12]}{words.data}); use another {words.output_dir}, or "
                         f"{words.start_over}")
    theirs = meta.get("plan")
    if theirs != plan.fingerprint():
        raise ValueError(f"output_dir {run_dir} holds checkpoints of another plan ({theirs}, {words.this} plans "
                         f"{plan.fingerprint()}: {words.plan} or the planner's version differ); use another "
                         f"{words.output_dir}, or {words.start_over}")
    return latest


def check_epochs_trained(latest: CheckpointInfo, epochs: int, run_dir: Path, words: ResumeWords) -> None:
    """Refuse to train up to fewer epochs than the checkpoint already trained."""
    if latest.cursor.epoch > epochs:
        raise ValueError(f"epochs must be at least the {latest.cursor.epoch} epochs already trained in {run_dir}, "
                         f"got {epochs}; pass {words.epochs}{latest.cursor.epoch} or more, or {words.start_over}")


def check_resume(config: TrainConfig, plan: Plan, run_dir: Path, identity: str | None,
                 candidates: tuple[CheckpointInfo, ...]) -> Cursor:
    """The cursor of the newest restorable checkpoint, if it continues this plan on this data (numpy only)."""
    latest = check_same_run(candidates, plan, identity, run_dir, COMMAND)
    framework = latest.meta.get("framework", config.compute.framework)
    if framework != config.compute.framework:
        raise ValueError(f"output_dir {run_dir} holds checkpoints written with --framework {framework}; resume "
                         f"with --framework {framework}, or use another --output-dir")
    facts = latest.meta.get("config") or {}
    for key, flag, get in _KEPT:
        if key in facts and facts[key] != get(config):
            was, now = (f"{v:g}" if isinstance(v, float) else str(v) for v in (facts[key], get(config)))
            raise ValueError(f"output_dir {run_dir} holds checkpoints trained with {flag} {was}, this run has {flag} "
                             f"{now}; a resume continues the checkpoint's model and optimizer: resume with {flag} "
                             f"{was}, or --no-resume to start over there, or use another --output-dir")
    check_epochs_trained(latest, config.schedule.epochs, run_dir, COMMAND)
    return latest.cursor


def learning_rate_note(cfg: TrainConfig, guard: TrainingGuard, state) -> str | None:
    """After a restore: the rate to train at, set on ``state``; a line to print when ``--learning-rate`` changed it.

    The checkpoint's rate is kept (the anomaly policy may have lowered it) unless the configured
    rate differs from the one the checkpoint's run was configured with: then the user changed
    the flag, and it is honoured.
    """
    meta = guard.saved.meta
    before = (meta.get("config") or {}).get("learning_rate")
    anomaly = meta.get("anomaly") or {}
    if before is None and not anomaly.get("restores"):  # format 2: the rate in use is the configured one
        before = meta.get("learning_rate")
    wanted = cfg.optimizer.learning_rate
    if before is None or math.isclose(float(before), wanted, rel_tol=1e-6):  # TF keeps the rate as float32
        return None
    trained = float(state.learning_rate)
    state.learning_rate = wanted
    return f"learning rate {wanted:g} from --learning-rate (the checkpoint trained at {trained:g})"
