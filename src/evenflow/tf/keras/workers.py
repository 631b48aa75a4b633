"""``evenflow.tf.fit`` across worker processes: who this worker is, the all-gather, the collective timeout.

Under ``MultiWorkerMirroredStrategy`` every worker runs the same ``fit`` call: Keras's ``model.fit``
on this worker's rows of the plan (:func:`~evenflow.tf.keras.data.keras_worker_dataset`). What
the run around it needs from the other workers goes through :class:`FitWorkers`:

* the chief (worker 0) writes the run directory's shared files (``history.json``, ``ids.npz``),
  every worker its own audit segments and its part of each checkpoint;
* :meth:`FitWorkers.all_gather` gathers per-replica rows (the epoch's sums, which checkpoint each
  worker resumes from), under the strategy's collective timeout;
* :meth:`FitWorkers.watch_callback` times every Keras batch against the collective timeout of a
  strategy from :func:`~evenflow.tf.strategy.make_strategy`, so a step that waits for a dead peer
  longer than ``Communication.timeout_seconds`` ends; :meth:`FitWorkers.failure` turns the error into
  one line that says how to resume.

A single worker (``MirroredStrategy``) is the degenerate case: chief, gathers nothing, never times out.
"""
from __future__ import annotations

import numpy as np

from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.launch.cluster import Cluster
from evenflow.tf.strategy import collective_failure, collective_watch, is_chief, local_replicas, num_workers


def check_workers(strategy, rebalance, simulate, replicas: int) -> None:
    """Check ``simulate`` against the plan's replicas; refuse what ``fit`` does on one worker only (re-plans from
    measured speeds, simulated slow replicas)."""
    if simulate is not None:
        simulate.check(replicas)
    if num_workers(strategy) > 1 and (rebalance or simulate is not None):
        what = "rebalance" if rebalance else "simulate"
        raise ValueError(f"{what}= re-plans from each replica's measured step times, which evenflow.tf.fit measures "
                         f"on one worker only; under MultiWorkerMirroredStrategy leave {what} out, or use "
                         f"`evenflow train --rebalance on` across workers")


def _cluster(strategy) -> Cluster:
    """The workers of a multi-worker strategy as its cluster resolver knows them (``TF_CONFIG`` or your own)."""
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict()
    chief = list(jobs.get("chief", []))  # MultiWorkerMirroredStrategy numbers a chief first
    index = 0 if resolver.task_type == "chief" else int(resolver.task_id or 0) + len(chief)
    return Cluster(tuple(chief + list(jobs.get("worker", []))), index, has_chief=bool(chief))


class FitWorkers:
    """The worker processes of one ``fit`` call's strategy (see the module docstring)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.count = num_workers(strategy)
        self.local = local_replicas(strategy)
        self.chief = is_chief(strategy)
        self.cluster = _cluster(strategy) if self.count > 1 else None
        self.index = self.cluster.index if self.cluster is not None else 0
        self.replica_ids = list(range(self.index * self.local, (self.index + 1) * self.local)) if self.count > 1 \
            else list(range(int(strategy.num_replicas_in_sync)))
        self.watch = collective_watch(strategy)
        self._gather = None

    def all_gather(self, rows) -> np.ndarray:
        """float64 ``[local replicas, k]`` -> ``[all replicas, k]`` (worker w holds replicas ``w*R .. w*R+R-1``)."""
        rows = np.asarray(rows, dtype=np.float64)
        if self.count == 1:
            return rows
        tf = _tf()
        if self._gather is None:
            strategy = self.strategy
            self._gather = tf.function(lambda values: strategy.gather(values, axis=0))
        values = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[ctx.replica_id_in_sync_group % self.local][None]))
        with self.watch.waiting():
            return self._gather(values).numpy()

    def watch_callback(self):
        """A Keras callback that holds every train and test batch to the collective timeout."""
        watch, held = self.watch, []

        def begin(batch, logs=None):
            held.append(watch.waiting())
            held[-1].__enter__()

        def end(batch, logs=None):
            if held:
                held.pop().__exit__(None, None, None)

        return _keras().callbacks.LambdaCallback(on_train_batch_begin=begin, on_train_batch_end=end,
                                                 on_test_batch_begin=begin, on_test_batch_end=end)

    def failure(self, error: BaseException, run_dir):
        """The one-line error for ``error`` when a peer was lost, else None."""
        if self.cluster is None:
            return None
        return collective_failure(error, self.cluster, run_dir=run_dir)
