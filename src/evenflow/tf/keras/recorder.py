"""What each replica trained on, reported from inside Keras's traced steps to the host.

:class:`StepRecorder` collects, per replica and step, the sample ids, ``[loss sum, hits, real
count]`` and host-clock stamps: what the audit, checkpoints, telemetry and re-plans of
:mod:`evenflow.tf.keras.run` read. :func:`~evenflow.tf.keras.steps.exact_steps` writes to it.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import wall_clock


class StepRecorder:
    """Collects, from inside the traced steps, what each replica trained on (host side).

    Each record is ``(replica, ids [slots] int64, sums [3] float64, stamps [2] float64)``:
    ``sums`` is ``[loss sum over real samples, hits, real count]`` (the loss as Keras shows
    it, regularization included) and ``stamps`` the host clock when the replica's inputs were
    there and when its gradients were.

    Args:
        simulate: an :class:`~evenflow.run.simulate.Simulation` to emulate slow replicas (their
            gradients are held back, as :class:`~evenflow.tf.trainer.Trainer` does), or None.
            Steps count from the recorder's creation.
    """

    # Steps a reader of the records may leave unread: they reach the host as each step runs.
    capacity = 1

    def __init__(self, simulate=None):
        self._lock = threading.Lock()
        self._records: list[tuple] = []
        self.simulate = simulate if simulate is not None and simulate.active else None
        self._steps: dict[int, int] = {}

    def _record(self, replica, ids, sums, started):
        replica, sums, started = int(replica), np.asarray(sums, np.float64), float(started)
        done = time.time()
        if self.simulate is not None:
            done = self._emulate(replica, started, done, float(sums[2]))
        with self._lock:
            self._records.append((replica, np.asarray(ids, np.int64), sums, np.array([started, done])))
        return np.float64(done)

    def _emulate(self, replica: int, started: float, now: float, real: float) -> float:
        """Hold the replica until its emulated device is done (see :mod:`evenflow.run.simulate`)."""
        with self._lock:
            step = self._steps.get(replica, 0)
            self._steps[replica] = step + 1
        factor = 1.0
        for slow in self.simulate.slow:
            if slow.replica == replica and step >= slow.from_step:
                factor *= slow.factor
        compute = max(now - started, 0.0)
        delay = factor * max(compute, self.simulate.sample_ms / 1000.0 * real) - compute
        if delay > 0:
            time.sleep(delay)
            now = time.time()
        return now

    def drain(self) -> list[tuple]:
        """The records since the last call, in the order the replicas finished them."""
        with self._lock:
            out, self._records = self._records, []
        return out

    def stamp(self, after):
        """Graph op: the host clock once ``after`` are computed."""
        tf = _tf()
        with tf.control_dependencies(after):
            return tf.ensure_shape(tf.py_function(wall_clock, [], tf.float64), [])

    def record(self, ids, sums, started, after):
        """Graph op: record one replica's step once ``after`` (its gradients) are computed."""
        tf = _tf()
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.control_dependencies([a for a in after if a is not None]):
            return tf.py_function(self._record, [replica, ids, tf.cast(sums, tf.float64), started], tf.float64)


def recorder_of(model, simulate=None) -> StepRecorder:
    """The recorder the model's exact steps write to, if it emulates ``simulate``; else a new one.

    Reusing it keeps Keras's traced step functions (a new recorder means tracing them again).
    """
    current = getattr(model, "_evenflow_exact", None)
    recorder = current.recorder if current is not None else None
    wanted = simulate if simulate is not None and simulate.active else None
    if recorder is None or type(recorder) is not StepRecorder or recorder.simulate != wanted:
        return StepRecorder(simulate)
    recorder.drain()
    return recorder
