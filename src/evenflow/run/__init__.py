"""The framework-neutral run: everything about a training run that is not TensorFlow or PyTorch.

Read it top to bottom in this order:

* :mod:`~evenflow.run.options`, :mod:`~evenflow.run.data_options`, :mod:`~evenflow.run.config`: the options of
  a run, from TOML and flags;
* :mod:`~evenflow.run.adapter`: the interface a framework implements (:class:`Framework`, :class:`Session`);
* :mod:`~evenflow.run.job`: one run end to end (:func:`run_training`): prepare, start, train, summarize;
* :mod:`~evenflow.run.training`, :mod:`~evenflow.run.summary`: the training part and what the run reports;
* :mod:`~evenflow.run.loop`, :mod:`~evenflow.run.step_options`: the training loop every framework runs
  (:class:`TrainLoop` over an :class:`Engine`) and the options its engines take, whole;
* :mod:`~evenflow.run.guard`, :mod:`~evenflow.run.checkpoints`, :mod:`~evenflow.run.audit`,
  :mod:`~evenflow.run.audit_ids`, :mod:`~evenflow.run.anomaly`: crash-safe checkpoints, the audit trail and
  its map back to the data's files and records, non-finite steps;
* :mod:`~evenflow.run.monitor`, :mod:`~evenflow.run.simulate`: per-replica telemetry, re-plans, emulated devices;
* :mod:`~evenflow.run.preflight`, :mod:`~evenflow.run.models`, :mod:`~evenflow.run.results`,
  :mod:`~evenflow.run.runlog`: checks before the first step, model names, result types, TensorBoard.

Nothing here imports TensorFlow or PyTorch.

Public: the names this package exports (its ``__all__``); the modules above are internal (a reading
guide, not an import path) and may change without notice, so import from ``evenflow.run``.
"""
from evenflow.run.adapter import Framework, Processes, Session
from evenflow.run.anomaly import AnomalyPolicy, TrainingDiverged
from evenflow.run.audit import AuditLog, check_audit
from evenflow.run.checkpoints import Checkpointer, ModelState, NonFiniteModelError, list_checkpoints
from evenflow.run.config import TrainConfig, load_config
from evenflow.run.guard import TrainingGuard
from evenflow.run.job import prepare, run_training
from evenflow.run.loop import Engine, TrainLoop
from evenflow.run.monitor import ReplicaMonitor
from evenflow.run.options import AnomalyOptions
from evenflow.run.results import EpochResult, EvalResult
from evenflow.run.simulate import Simulation, SlowReplica

__all__ = [
    "AnomalyOptions", "AnomalyPolicy", "AuditLog", "Checkpointer", "Engine", "EpochResult", "EvalResult",
    "Framework", "ModelState", "NonFiniteModelError", "Processes", "ReplicaMonitor", "Session", "Simulation",
    "SlowReplica", "TrainConfig", "TrainLoop", "TrainingDiverged", "TrainingGuard", "check_audit", "list_checkpoints", "load_config", "prepare",
    "run_training",
]
