"""The interface between the framework-neutral run and a framework: what an adapter implements.

A run (:mod:`evenflow.run.job`) asks a :class:`Framework` two things before anything is
written, with numpy only: which processes take part and how many replicas each holds
(:meth:`Framework.processes`, from ``TF_CONFIG`` or ``torchrun``'s variables), and which
options it cannot honour there (:meth:`Framework.refusals`, each refusal an exit-2 error
naming the flag: nothing accepted is silently ignored). Then :meth:`Framework.start` starts the framework and returns
a :class:`Session`: the distributed context, the model and optimizer, the readers, the
:class:`~evenflow.run.loop.TrainLoop` over the adapter's engine, the checkpoint state and the
TensorBoard writer. Everything else — plans, checkpoints, audit, anomaly policy, telemetry,
re-plans, progress, summaries — is the run layer's, the same for every framework.

``evenflow.tf.adapter`` and ``evenflow.torch.adapter`` implement it; a third framework is one
more folder with one more adapter.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evenflow.plan.topology import Topology


@dataclass(frozen=True)
class Processes:
    """Who takes part in a run: processes holding replicas (TF workers or torch ranks), and this one.

    Attributes:
        count: processes that hold replicas, >= 1.
        index: this process, in ``[0, count)``; process 0 is the chief (it writes the run's outputs).
        local_replicas: replicas each process holds.
    """

    count: int = 1
    index: int = 0
    local_replicas: int = 1

    @property
    def replicas(self) -> int:
        return self.count * self.local_replicas

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def topology(self) -> Topology:
        return Topology(self.replicas)


@dataclass(kw_only=True)
class Session:
    """A started framework for one run (see the module docstring): each adapter's session derives from it,
    adding its own fields (strategy, cluster) and :meth:`writer`, and overriding what it does differently.

    Attributes:
        processes: the final :class:`Processes`.
        trainer: the framework's trainer; its ``loop`` is the session's :attr:`loop`.
        devices: this process's replica devices, e.g. ``["cpu:0", "cpu:1"]``.
        description: one line, e.g. ``"4 replicas (cpu:0, ...), MirroredStrategy"``.
        num_weights: the model's trainable parameter count.
        state: the :class:`~evenflow.run.checkpoints.ModelState` checkpoints save and restore.
        train_reader, test_reader: what the loop reads the training and test sets with (test: None or one).
        shared_cpu: the replicas are logical devices sharing one CPU's cores (they have no speed
            of their own: rebalancing ``auto`` stays off).
        summary: framework facts for ``summary.json`` (backend, precision, ...).
        run_dir: where the run's checkpoints are (named by a failure's line).
    """

    processes: Processes
    trainer: object
    devices: list[str]
    description: str
    num_weights: int
    state: object
    train_reader: object
    test_reader: object
    shared_cpu: bool = False
    summary: dict = field(default_factory=dict)
    run_dir: Path | None = None

    @property
    def loop(self):
        """The :class:`~evenflow.run.loop.TrainLoop` over this framework's engine."""
        return self.trainer.loop

    def running(self) -> contextlib.AbstractContextManager:
        """A context the training loop runs in (e.g. a shorter GIL switch interval while timing)."""
        return contextlib.nullcontext()

    def writer(self, directory: Path):
        """A :class:`~evenflow.run.runlog.ScalarWriter` of TensorBoard events in ``directory``."""
        raise NotImplementedError(f"{type(self).__name__} must say how it writes TensorBoard events")

    def failure(self, error: BaseException) -> BaseException | None:
        """The one-line error to report for ``error`` (a lost peer, a bad record), or None to re-raise it."""
        return None

    def close(self, ok: bool) -> None:
        """End the session (process groups, servers); ``ok`` is False after an error. Nothing to release here."""


class Framework(Protocol):
    """A framework adapter (see the module docstring).

    Attributes:
        name: ``"tf"`` or ``"torch"`` (the ``--framework`` value).
    """

    name: str

    def refusals(self, config, processes: Processes) -> list[str]:
        """One line per option of ``config`` this framework cannot honour on ``processes`` (numpy only; empty if none).

        """

    def processes(self, config) -> Processes:
        """Who takes part, from the environment and ``config`` (numpy only)."""

    def notes(self, config, processes: Processes) -> list[str]:
        """Lines the run prints about options that have nothing to act on here (e.g. a timeout between
        processes in a run of one process): accepted, so the same command works on any number of
        processes, and said, so nothing is silently ignored."""

    def refuses_data(self, data, config) -> str | None:
        """Why this framework cannot train on the loaded ``data`` (one line), or None."""

    def start(self, prepared) -> Session:
        """Start the framework for a :class:`~evenflow.run.job.Prepared` run and build its model."""
