"""The workers of a multi-worker TensorFlow run agree on the plan and the data before the model exists.

:func:`check_workers_agree_tf` runs :func:`~evenflow.run.preflight.check_workers_agree` over a
``MultiWorkerMirroredStrategy`` right after it connects the workers, before the model is built:
creating a model's variables under the strategy broadcasts worker 0's initial values, a
collective that fails with TensorFlow's own error (``Shape mismatch in the collective``) on
workers whose feature shapes differ, and that passes silently on workers whose data differs
but whose shapes agree. The all-gather waits under the run's collective timeout
(:func:`~evenflow.tf.strategy.collective_watch`).
"""
from __future__ import annotations

import numpy as np

from evenflow.run.preflight import check_workers_agree
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.strategy import local_replicas


def check_workers_agree_tf(strategy, plan, identity: str | None) -> None:
    """ValueError on every worker unless all build ``plan`` alike and load data of ``identity``; nothing for one."""
    from evenflow.tf.strategy import collective_watch, num_workers

    workers = num_workers(strategy)
    if workers <= 1:
        return
    tf = _tf()
    local = local_replicas(strategy)
    gather = tf.function(lambda values: strategy.gather(values, axis=0))

    def rows_of_all(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.float64)
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[ctx.replica_id_in_sync_group % local][None]))
        with collective_watch(strategy).waiting():
            return gather(values).numpy()

    check_workers_agree(rows_of_all, plan, local, workers, identity)
