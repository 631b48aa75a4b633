"""What a framework's training step takes from a run's options, in one frozen dataclass (internal).

The engines (:class:`~evenflow.tf.replica_step.ReplicaStep`, :class:`~evenflow.torch.engine.TorchEngine`)
read their settings from the run's :class:`~evenflow.run.options.ComputeOptions` and
:class:`~evenflow.run.options.AnomalyOptions`, handed down whole: a default lives in those
dataclasses only. The public trainers build one from their keyword arguments, whose defaults they read from
those dataclasses; ``evenflow train`` builds one from its config (:meth:`StepOptions.of_config`)
and hands it to the trainer's ``from_options``.
"""
from __future__ import annotations

from dataclasses import dataclass

from evenflow.run.options import AnomalyOptions, ComputeOptions
from evenflow.run.simulate import Simulation


@dataclass(frozen=True)
class StepOptions:
    """The compute and anomaly options of a run, and whether (and how slowly) its steps are timed.

    Args:
        compute: accumulation, gradient compression, precision and bucket sizes are read from it.
        anomaly: ``skip_nonfinite`` is read from it.
        timing: time every replica's step (needed by a monitor).
        simulate: an active :class:`~evenflow.run.simulate.Simulation` of slow devices, or None.
    """

    compute: ComputeOptions
    anomaly: AnomalyOptions
    timing: bool
    simulate: Simulation | None

    @classmethod
    def of_config(cls, config) -> StepOptions:
        """The step options of a :class:`~evenflow.run.config.TrainConfig`: timed with telemetry on."""
        return cls(config.compute, config.anomaly, config.monitor.telemetry, config.monitor.simulation())

