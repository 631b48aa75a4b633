"""What each replica trained on, kept on its device and read back by the host in batches of steps.

:class:`StepBuffer` records what :class:`~evenflow.tf.keras.recorder.StepRecorder` records
(per replica and step: the sample ids, ``[loss sum, hits, real count]`` and two clock stamps)
without a host callback inside the step: each replica writes its step's row into ring buffers
on its own device (variables of the strategy, one copy per replica), and :meth:`StepBuffer.drain`
reads every row written since the last call in one transfer per buffer. The stamps are
``tf.timestamp()`` values (the host clock, as ``time.time()``) taken when the replica's inputs
were there and when its gradients were: after one element of the first variable's gradient
(the last one backpropagation computes) reached the host, so on an accelerator the stamp waits
for the gradients to be computed, not only queued. ``evenflow.tf.fit`` uses it for its run
directory and telemetry; :mod:`evenflow.tf.keras.run` reads it back at the steps that need the
rows (checkpoints, epoch ends), before it can overflow, and every few seconds.
"""
from __future__ import annotations

import numpy as np

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.keras.recorder import StepRecorder

# Sample ids a replica's buffer holds (int64: 2 MB per replica); the host reads it back before it fills.
BUFFER_IDS = 1 << 18


def buffer_capacity(width: int) -> int:
    """Steps a buffer of rows of ``width`` ids holds."""
    return max(1, BUFFER_IDS // max(int(width), 1))


def _on_host(tensors) -> list:
    """One element of each of ``tensors`` copied to the host: a stamp after them is taken once they are
    computed, on an accelerator too (a control dependency alone waits only until their kernels are queued)."""
    tf = _tf()
    out = []
    for t in tensors:
        t = tf.convert_to_tensor(t.values if isinstance(t, tf.IndexedSlices) else t)
        with tf.device("/cpu:0"):
            out.append(tf.identity(tf.reshape(t, [-1])[:1]))
    return out


class StepBuffer(StepRecorder):
    """Per-replica ring buffers of step records on the devices of ``strategy`` (see the module docstring).

    Args:
        strategy: the ``tf.distribute`` strategy the model was compiled under.
        width: the most sample ids one replica reads per step (the global batch size bounds it).

    Attributes:
        capacity: steps each replica's buffer holds; :meth:`drain` must be called at least that often.
    """

    def __init__(self, strategy, width: int):
        super().__init__(None)
        tf = _tf()
        self.strategy, self.width, self.capacity = strategy, int(width), buffer_capacity(width)
        local = {"synchronization": tf.VariableSynchronization.ON_READ,
                 "aggregation": tf.VariableAggregation.NONE, "trainable": False}
        with strategy.scope():
            # Per row: replica id, number of ids, then the ids (-1 past them).
            self._ints = tf.Variable(tf.fill([self.capacity, self.width + 2], tf.constant(-1, tf.int64)), **local)
            # Per row: loss sum, hits, real count, inputs-ready stamp, gradients-ready stamp.
            self._floats = tf.Variable(tf.zeros([self.capacity, 5], tf.float64), **local)
            self._count = tf.Variable(tf.zeros([], tf.int64), **local)
        self._read: list[int] | None = None

    def stamp(self, after):
        """Graph op: the clock once ``after`` are computed (``tf.timestamp()``)."""
        tf = _tf()
        with tf.control_dependencies(after):
            return tf.timestamp()

    def record(self, ids, sums, started, after):
        """Graph op: write one replica's step to its buffer once ``after`` (its gradients) are computed."""
        tf = _tf()
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        after = [a for a in after if a is not None]
        with tf.control_dependencies(after + _on_host(after[:1])):
            done = tf.timestamp()
        ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
        n = tf.shape(ids, out_type=tf.int64)[0]
        row = tf.concat([tf.stack([replica, n]), ids, tf.fill([self.width - tf.shape(ids)[0]],
                                                               tf.constant(-1, tf.int64))], 0)
        floats = tf.concat([tf.cast(sums, tf.float64), tf.stack([tf.cast(started, tf.float64), done])], 0)
        at = tf.reshape(self._count % self.capacity, [1])
        # The handles in a replica's context are its own copies' (ResourceScatterUpdate writes one row).
        writes = [tf.raw_ops.ResourceScatterUpdate(resource=self._ints.handle, indices=at, updates=row[None]),
                  tf.raw_ops.ResourceScatterUpdate(resource=self._floats.handle, indices=at, updates=floats[None])]
        with tf.control_dependencies(writes):
            return self._count.assign_add(1)

    def _local(self, variable) -> list[np.ndarray]:
        return [v.numpy() for v in self.strategy.experimental_local_results(variable)]

    def _rows(self, variable, start: list[int], stop: list[int]) -> list[np.ndarray]:
        """Per replica, the rows of steps ``start[k]`` up to ``stop[k]`` of its copy of ``variable``, in step order
        (only those rows are read: a whole buffer is 2 MB)."""
        out = []
        for v, a, b in zip(self.strategy.experimental_local_results(variable), start, stop):
            i, n = a % self.capacity, b - a
            if i + n <= self.capacity:
                out.append(v[i:i + n].numpy())
            else:  # the ring wrapped around
                out.append(np.concatenate([v[i:].numpy(), v[:i + n - self.capacity].numpy()]))
        return out

    def skip(self) -> None:
        """Forget the records written so far (steps run outside a read-back schedule, e.g. your own ``model.fit``)."""
        self._read = [int(c) for c in self._local(self._count)]

    def drain(self) -> list[tuple]:
        """The records written since the last call, per replica in step order (one read per buffer)."""
        counts = [int(c) for c in self._local(self._count)]
        read = self._read if self._read is not None and len(self._read) == len(counts) else [0] * len(counts)
        self._read = counts
        new = [c - r for c, r in zip(counts, read)]
        if max(new, default=0) > self.capacity:
            raise RuntimeError(f"{max(new)} steps were written to a step buffer of {self.capacity} before it was "
                               f"read back; please report this as a bug")
        if not any(new):
            return []
        out = []
        for ints, floats in zip(self._rows(self._ints, read, counts), self._rows(self._floats, read, counts)):
            out.extend((int(row[0]), row[2:2 + int(row[1])].copy(), f[:3].copy(), f[3:].copy())
                       for row, f in zip(ints, floats))
        return out


def buffer_of(model, width: int) -> StepBuffer:
    """The buffer the model's exact steps write to, if it holds rows of ``width``; else a new one.

    Reusing it keeps Keras's traced step functions (a new buffer means tracing them again).
    """
    current = getattr(model, "_evenflow_exact", None)
    buffer = current.recorder if current is not None else None
    if isinstance(buffer, StepBuffer) and buffer.width == int(width) and buffer.strategy is model.distribute_strategy:
        buffer.skip()
        return buffer
    return StepBuffer(model.distribute_strategy, width)
