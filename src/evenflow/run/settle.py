"""A settled step's outputs handed to the run's bookkeeping, the same way by every loop that trains on a plan.

:class:`~evenflow.run.loop.TrainLoop` (``evenflow train``, both frameworks' ``Trainer.fit``) and
:class:`~evenflow.tf.keras.run.PlanCallback` (``evenflow.tf.fit``) read each step's outputs back as a
row of numpy arrays (``replica``, ``ids``, ``sums``, ``flags``, and ``timing`` on an update's last
step) and call :func:`settle_step` with each, in step order; :func:`speed_decision` after each update.
"""
from __future__ import annotations


def settle_step(epoch: int, step: int, row: dict, tally, guard=None, monitor=None) -> None:
    """Count plan step ``step`` of ``epoch`` in the epoch's :class:`~evenflow.run.results.Tally`, the
    :class:`~evenflow.run.guard.TrainingGuard`'s audit and anomaly policy, and the
    :class:`~evenflow.run.monitor.ReplicaMonitor`'s telemetry (guard and monitor: None when the run has none)."""
    tally.add(row)
    if guard is not None:
        guard.record(epoch, step, row)
    if monitor is not None:
        monitor.record(epoch, step, row)


def speed_decision(monitor, all_gather, end_of_epoch: bool):
    """When the monitor is due, its window gathered across processes (``all_gather``) and absorbed: the
    :class:`~evenflow.plan.speed.rebalancer.Decision` if it has new weights, else None (every process alike)."""
    if not monitor.due(end_of_epoch):
        return None
    decision = monitor.absorb(all_gather(monitor.window()), end_of_epoch=end_of_epoch)
    return decision if decision is not None and decision.weights is not None else None
