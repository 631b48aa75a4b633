"""A reader's position in Ray Train's checkpoints: saved with ``ray.train.report``, restored on any number of workers.

A plan-driven reader (:class:`evenflow.torch.PlanLoader`, :class:`evenflow.torch.PlanBatchSampler`) holds
one position, ``{"epoch", "step", "plan", "replicas"}`` (its ``state_dict()``), and a plan's global
steps do not depend on the number of workers. So when Ray Train restarts a worker group (a worker
lost, ``FailureConfig(max_failures=...)``) or starts it on another number of workers (elastic
``ScalingConfig(num_workers=(min, max))``, or a new run from a checkpoint), the restored reader
reads exactly the epoch's remaining samples, each once.

:func:`report_checkpoint` writes the position as ``evenflow-position.json`` (JSON, no pickle) into
the checkpoint folder next to the model files the caller wrote there, and reports it on rank 0;
every worker calls it at the same steps, as ``ray.train.report`` asks. :func:`restore` loads the
position of the checkpoint Ray hands a (re)started worker into the reader.

TensorFlow's readers (:class:`evenflow.tf.PlanReader`, ``evenflow.tf.fit``) hold no position: a
``tf.data`` pipeline reads from the :class:`~evenflow.plan.cursor.Cursor` it was built with. A
TensorFlow loop therefore saves its own, ``report_checkpoint(metrics, None, folder,
position={"epoch": e, "step": s})``, and starts again from ``Cursor(**restored_position())``.
"""
from __future__ import annotations

import json
import os
import tempfile

from evenflow.ray._lazy import ray_train

POSITION_FILE = "evenflow-position.json"


def _state_of(reader) -> dict:
    state = getattr(reader, "state_dict", None)
    if not callable(state):
        raise TypeError(f"reader must have state_dict() (a PlanLoader or PlanBatchSampler), got "
                        f"{type(reader).__name__}; without one (TensorFlow) pass position={{'epoch': e, 'step': s}}")
    return state()


def report_checkpoint(metrics: dict, reader, directory: str | os.PathLike | None = None,
                      position: dict | None = None) -> None:
    """``ray.train.report(metrics, checkpoint=...)`` with ``reader``'s position in the checkpoint.

    Call it on every worker at the same step (Ray's rule for ``report``); rank 0's checkpoint is kept.

    Args:
        metrics: the metrics to report (a dict of plain values).
        reader: a plan-driven reader with ``state_dict()`` (``PlanLoader``, ``PlanBatchSampler``); None with
            ``position`` (a TensorFlow loop: its readers hold no position).
        directory: a folder of files rank 0 wrote for this checkpoint (model, optimizer); the position is
            added to it. None: a checkpoint of the position alone.
        position: the state to save instead of ``reader.state_dict()``, e.g. ``sampler.state_dict(next_step=s + 1)``
            when ``DataLoader`` worker processes read ahead of the loop, or ``{"epoch": e, "step": s}`` of a
            TensorFlow loop (the ``Cursor`` it resumes from).

    Raises:
        TypeError: ``reader`` has no ``state_dict()`` or ``metrics`` is not a dict.
    """
    train = ray_train()
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    state = _state_of(reader) if position is None else dict(position)
    if train.get_context().get_world_rank() != 0:
        train.report(metrics, checkpoint=None)
        return
    with tempfile.TemporaryDirectory(prefix="evenflow-ray-") as scratch:
        folder = os.fspath(directory) if directory is not None else scratch
        with open(os.path.join(folder, POSITION_FILE), "w") as fh:
            json.dump(state, fh)
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(folder))


def restored_position(checkpoint=None) -> dict | None:
    """The reader position saved in ``checkpoint`` (default: the one Ray hands this worker), or None.

    None when there is no checkpoint (a fresh start). Raises ValueError for a checkpoint without a position.
    """
    if checkpoint is None:
        checkpoint = ray_train().get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, POSITION_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {checkpoint.path} has no {POSITION_FILE}; report it with "
                             f"evenflow.ray.report_checkpoint(metrics, reader)")
        with open(path) as fh:
            return json.load(fh)


def restore(reader, checkpoint=None):
    """Resume ``reader`` at the position of the checkpoint Ray hands this worker, else of ``checkpoint``.

    Ray hands a checkpoint to a worker group it restarts (the newest one this run reported); ``checkpoint``
    (a ``ray.train.Checkpoint``, e.g. of an earlier run) is where a fresh start begins, and is not read
    again after a restart. Returns the checkpoint restored from (load the model and optimizer from it
    too), or None when there is none (the reader is left as it is). The position restores on any
    number of workers.

    Raises:
        TypeError: ``reader`` has no ``load_state_dict``.
        ValueError: a checkpoint without a position, or one of another plan (the reader says which).
    """
    if not callable(getattr(reader, "load_state_dict", None)):
        raise TypeError(f"reader must have load_state_dict() (a PlanLoader or PlanBatchSampler), got "
                        f"{type(reader).__name__}")
    checkpoint = ray_train().get_checkpoint() or checkpoint
    state = restored_position(checkpoint)
    if state is None:
        return None
    reader.load_state_dict(state)
    return checkpoint
