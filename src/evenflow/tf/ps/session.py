"""Starting a parameter-server run on its chief: strategy, model, optimizer, trainer and readers.

:func:`start_ps_session` is :meth:`evenflow.tf.adapter.TensorFlow.start` under ``--strategy ps``.
The chief connects to the cluster's workers and parameter servers (``TF_CONFIG``), creates the
model's variables on the parameter servers (split across them when large) and runs the training
loop; each plan step becomes a closure that the first free worker runs
(:mod:`evenflow.tf.ps.engine`). The plan has one replica: a step is one update of the global batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evenflow.run.adapter import Session
from evenflow.run.rerun import rerun_advice
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.ps.cluster import PSTask
from evenflow.tf.session import TFSession


class ParameterServerLost(RuntimeError):
    """A parameter server stopped answering: the run stops (exit 1, one line) and resumes when rerun."""


@dataclass(kw_only=True)
class PSSession(Session):
    """A started parameter-server run, on its chief (:class:`evenflow.run.adapter.Session`)."""

    task: PSTask
    strategy: object
    timed: bool = False  # no per-replica step times: free workers take the next step

    writer = TFSession.writer

    def failure(self, error: BaseException) -> BaseException | None:
        """A parameter server that stopped answering, as one line naming the checkpoint a rerun resumes from;
        else None."""
        tf = _tf()
        if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError)) and "/job:ps" in str(error):
            first = str(error).strip().splitlines()[0][:200]
            return ParameterServerLost(
                f"a parameter server of the cluster (1 chief, {self.task.workers} worker(s), {self.task.ps} ps) "
                f"stopped answering ({first}); restart it and {rerun_advice(self.run_dir)}")
        return None


def start_ps_session(p, task: PSTask) -> PSSession:
    """A :class:`PSSession` for the :class:`~evenflow.run.job.Prepared` run ``p`` on the chief."""
    from evenflow.tf.optimizers import make_optimizer
    from evenflow.tf.ps.models import make_hashed_text, make_mlp
    from evenflow.tf.ps.training import PSTrainer, make_strategy
    from evenflow.tf.ps.engine import PSReader
    from evenflow.tf.state import TFState

    cfg, comp = p.config, p.config.compute
    tf = _tf()
    if comp.threads:
        tf.config.threading.set_intra_op_parallelism_threads(comp.threads)
    _keras().utils.set_random_seed(cfg.schedule.seed)
    strategy = make_strategy()
    with strategy.scope():
        if cfg.model.model == "hashed_text":
            model = make_hashed_text(p.data.num_classes, seed=cfg.schedule.seed)
        else:
            model = make_mlp(math.prod(int(d) for d in p.data.feature_shape), p.data.num_classes,
                             seed=cfg.schedule.seed)
        optimizer = make_optimizer(cfg.optimizer.optimizer, cfg.optimizer.learning_rate, "float32")
    trainer = PSTrainer(strategy, model, optimizer, skip_nonfinite=cfg.anomaly.skip_nonfinite)
    candidates = [model.table] if hasattr(model, "table") else list(model.kernels)
    largest = max(candidates, key=lambda v: math.prod(v.shape))
    shards = [int(v.shape[0]) for v in getattr(largest, "variables", [largest])]  # rows per parameter server
    description = (f"ParameterServerStrategy: {task.workers} worker(s) take the steps, {task.ps} parameter "
                   f"server(s) hold the variables (the largest, {list(largest.shape)}, in {len(shards)} shard(s) "
                   f"of {', '.join(map(str, shards))} rows)")
    held: dict[str, int] = {}  # bytes of the model's and the optimizer's variables on each parameter server
    for v in list(model.variables) + list(optimizer.variables):
        device = str(getattr(v, "device", None) or getattr(v.value, "device", "")).split("/device:")[0]
        held[device] = held.get(device, 0) + math.prod(v.shape) * tf.as_dtype(v.dtype).size
    return PSSession(processes=p.processes, task=task, strategy=strategy, trainer=trainer,
                     devices=[f"/job:worker/task:{i}" for i in range(task.workers)], description=description,
                     num_weights=int(sum(math.prod(v.shape) for v in model.trainable_variables)),
                     state=TFState(model, optimizer), train_reader=PSReader(p.data.train),
                     test_reader=None if p.data.test is None else PSReader(p.data.test),
                     summary={"tensorflow": tf.__version__, "strategy": type(strategy).__name__,
                              "workers": task.workers, "parameter_servers": task.ps, "largest_variable_shard_rows": shards,
                              "variable_bytes": dict(sorted(held.items())),
                              "optimizer": type(optimizer).__name__}, run_dir=p.run_dir)
