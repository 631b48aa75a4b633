"""Parameter-server training on the plan: the cluster's servers, a model, and the trainer on the chief.

A cluster (``TF_CONFIG``) has one ``chief``, ``worker`` tasks and ``ps`` tasks. Workers and
parameter servers only serve (:func:`~evenflow.tf.ps.cluster.serve`, or ``python -m evenflow.tf.ps.training``
with their ``TF_CONFIG``); the chief builds
a ``ParameterServerStrategy``, the model and the optimizer under its scope, and runs the
training loop with :class:`PSTrainer`, which schedules each plan step on a free worker
(:class:`~evenflow.tf.ps.engine.PSEngine`).

Keras 3 models cannot hold variables the strategy splits across parameter servers (a
``ShardedVariable`` has no ``handle`` for Keras's variables), so the models
(:mod:`evenflow.tf.ps.models`) are ``tf.Module`` s with plain ``tf.Variable`` s; a Keras
optimizer updates them.
"""
from __future__ import annotations

from evenflow.run.loop import LoopFront, TrainLoop
from evenflow.run.options import AnomalyOptions
from evenflow.tf._lazy import keras as _keras, tf as _tf
from evenflow.tf.ps.engine import PSEngine, PSReader


def make_strategy(min_shard_bytes: int = 256 << 10):
    """The chief's ``ParameterServerStrategy`` over ``TF_CONFIG``'s cluster.

    A variable of more than ``min_shard_bytes`` is split into up to one shard per parameter
    server (``MinSizePartitioner``), each holding a contiguous block of its rows.
    """
    tf = _tf()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    servers = len(resolver.cluster_spec().as_dict().get("ps", []))
    if servers < 1:
        raise ValueError("a parameter-server cluster needs at least one ps task in TF_CONFIG")
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=min_shard_bytes,
                                                                             max_shards=servers)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


class PSTrainer(LoopFront):
    """Trains a ``tf.Module`` on a parameter-server cluster from epoch plans of one replica (see the module).

    Args:
        strategy: :func:`make_strategy`'s strategy.
        model: a callable ``tf.Module`` made under ``strategy.scope()``.
        optimizer: a Keras optimizer made under ``strategy.scope()`` (built here on the model's variables).
        in_flight: steps scheduled ahead of the one the chief reads.
        skip_nonfinite: do not apply a step whose loss or gradients are non-finite (default
            :class:`~evenflow.run.options.AnomalyOptions`'s).
    """

    def __init__(self, strategy, model, optimizer, in_flight: int = 4,
                 skip_nonfinite: bool = AnomalyOptions.skip_nonfinite):
        _check_parts(strategy, model, optimizer)
        anomaly = AnomalyOptions(skip_nonfinite=skip_nonfinite)
        with strategy.scope():
            optimizer.build(model.trainable_variables)
        self.engine = PSEngine(strategy, model, optimizer, in_flight, anomaly)
        self.loop = TrainLoop(self.engine, 1)
        self.model, self.optimizer, self.strategy = model, optimizer, strategy

    def fit(self, source, plan, epochs: int, start=None, *, on_step=None, on_epoch=None, on_batch=None,
            guard=None):
        """Train from ``start`` (default the beginning) to the end of epoch ``epochs - 1``."""
        if plan.topology.replicas != 1:
            raise ValueError(f"a parameter-server plan has 1 replica (each step is one update, run by a free "
                             f"worker), got {plan.topology.replicas}; use ef.Topology(1)")
        return self.loop.fit(PSReader(source), plan, epochs, start=start, on_step=on_step, on_epoch=on_epoch,
                             on_batch=on_batch, guard=guard)

    def evaluate(self, source, plan, epoch: int = 0):
        """Exact loss and accuracy over epoch ``epoch`` of ``plan``: each step's sums are read once."""
        return self.loop.evaluate(PSReader(source), plan, epoch)


def _check_parts(strategy, model, optimizer) -> None:
    """Refuse, in one line each, a model, optimizer or strategy a parameter-server run cannot use."""
    tf, keras = _tf(), _keras()
    if isinstance(model, keras.Model):
        raise TypeError("model must be a tf.Module, not a Keras model: Keras 3 layers cannot hold the variables a "
                        "ParameterServerStrategy splits across servers; use evenflow.tf.ps.make_mlp or "
                        "make_hashed_text, or your own tf.Module with tf.Variables")
    if not isinstance(model, tf.Module) or not callable(model):
        raise TypeError(f"model must be a callable tf.Module made under strategy.scope() (evenflow.tf.ps.make_mlp, "
                        f"make_hashed_text), got {type(model).__name__}")
    if not model.trainable_variables:
        raise ValueError(f"the model {type(model).__name__} has no trainable variables to update")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a Keras optimizer made under strategy.scope() (keras.optimizers.SGD(0.1), "
                        f"...), got {type(optimizer).__name__}")
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise TypeError(f"strategy must be a tf.distribute.ParameterServerStrategy (evenflow.tf.ps.make_strategy() "
                        f"on the chief), got {type(strategy).__name__}")


if __name__ == "__main__":  # python -m evenflow.tf.ps.training: serve this process's TF_CONFIG task
    from evenflow.tf.ps.cluster import ps_task_from_env, serve

    serve(ps_task_from_env())
