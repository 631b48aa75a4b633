"""A custom-loop data-parallel trainer that executes epoch plans with ``tf.distribute``.

The custom loop is the main path because Keras 3's ``model.fit`` does not work under
MultiWorkerMirroredStrategy (keras-team/keras#20585) and because the loop is where the
plan's guarantees turn into arithmetic. :class:`Trainer` is a thin front: the
per-replica arithmetic is :class:`~evenflow.tf.replica_step.ReplicaStep` (masked loss,
summed gradients, agreed skips of non-finite steps, gradient accumulation, fp16
all-reduce), the TensorFlow dispatch is :class:`~evenflow.tf.engine.TFEngine`, and the
loop itself — epochs, checkpoints through a guard, rewinds, re-plans from measured
speeds, exact epoch figures — is the framework-neutral :class:`~evenflow.run.loop.TrainLoop`
that the PyTorch trainer runs too.

The same loop runs one worker (MirroredStrategy) or several
(MultiWorkerMirroredStrategy, :func:`~evenflow.tf.strategy.make_strategy`): each worker
reads the rows of its own replicas from the same plan, every replica runs the plan's
equal number of steps, and the per-replica sums of an epoch are all-gathered once at its
end, so every worker reports the same global figures.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable


from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.run.audit_ids import audit_source
from evenflow.run.loop import LoopFront, TrainLoop, check_accumulate_steps
from evenflow.run.options import COMPRESSIONS, AnomalyOptions, ComputeOptions
from evenflow.run.simulate import Simulation
from evenflow.run.step_options import StepOptions
from evenflow.util.validate import check_bool
from evenflow.run.results import EpochResult, EvalResult
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.engine import TFEngine
from evenflow.tf.losses import per_sample_cross_entropy
from evenflow.tf.replica_step import ReplicaStep


class Trainer(LoopFront):
    """Trains ``model`` data-parallel under ``strategy`` from epoch plans.

    Build the model and optimizer inside ``strategy.scope()`` before creating the trainer.

    A step whose loss or gradients are non-finite on any replica (the replicas agree on one
    verdict; under MirroredStrategy with plain gradients it is taken once from the summed
    gradients, so a sum beyond the float range counts too) is skipped as a whole when ``skip_nonfinite`` is on:
    no variable changes, not even the optimizer's step count. Under ``mixed_float16`` the
    loss-scale optimizer skips gradient overflows itself; a non-finite *loss* is still
    reported as an anomaly.

    Args:
        strategy: a ``tf.distribute`` strategy (MirroredStrategy for one worker).
        model: a ``keras.Model`` mapping features to logits.
        optimizer: a Keras 3 optimizer (a ``LossScaleOptimizer`` for ``mixed_float16``).
        loss_fn: ``fn(labels, logits) -> [slots]`` per-sample loss; default softmax cross-entropy.
        skip_nonfinite: skip the update of a step that is non-finite on any replica.
        accumulate_steps: plan steps per optimizer update, in ``[1, 64]``; 1 updates every step.
        compression: ``"none"`` or ``"fp16"``: the dtype gradients are all-reduced in.
            float16 overflows beyond +-65504 (a non-finite update, skipped like any other)
            and flushes magnitudes below ~6e-8 to zero.
        timing: time every replica's step (needed by a monitor).
        simulate: an :class:`~evenflow.run.simulate.Simulation` of slow devices (needs ``timing``).

    The defaults of ``skip_nonfinite``, ``accumulate_steps`` and ``compression`` are those of
    :class:`~evenflow.run.options.AnomalyOptions` and :class:`~evenflow.run.options.ComputeOptions`
    (``evenflow train``'s).

    Attributes:
        options: the :class:`~evenflow.run.step_options.StepOptions` its steps run with.
        plan: the plan :meth:`fit` runs now (the one passed in, or a re-plan with measured weights).
        replans: ``(cursor, weights)`` of each re-plan.
        cursor: how far training got.
    """

    def __init__(self, strategy, model, optimizer, loss_fn=per_sample_cross_entropy,
                 skip_nonfinite: bool = AnomalyOptions.skip_nonfinite,
                 accumulate_steps: int = ComputeOptions.accumulate_steps,
                 compression: str = ComputeOptions.gradient_compression, timing: bool = False, simulate=None):
        _check_parts(strategy, model, optimizer)
        accumulate_steps = check_accumulate_steps(accumulate_steps)  # all arguments before the step builds
        skip_nonfinite, timing = check_bool("skip_nonfinite", skip_nonfinite), check_bool("timing", timing)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        if simulate is not None and not isinstance(simulate, Simulation):
            raise TypeError(f"simulate must be an evenflow Simulation or None, got {type(simulate).__name__}")
        options = StepOptions(ComputeOptions(accumulate_steps=accumulate_steps, gradient_compression=compression),
                              AnomalyOptions(skip_nonfinite=skip_nonfinite), timing, simulate)
        self._start(strategy, model, optimizer, loss_fn, options)

    @classmethod
    def from_options(cls, strategy, model, optimizer, options: StepOptions,
                     loss_fn=per_sample_cross_entropy) -> Trainer:
        """A trainer set up by a run's options, whole (what ``evenflow train`` builds)."""
        _check_parts(strategy, model, optimizer)
        trainer = cls.__new__(cls)
        trainer._start(strategy, model, optimizer, loss_fn, options)
        return trainer

    def _start(self, strategy, model, optimizer, loss_fn, options: StepOptions) -> None:
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be a function (labels, logits) -> per-sample loss [slots], got "
                            f"{type(loss_fn).__name__}; e.g. evenflow.tf.per_sample_cross_entropy (the default)")
        if model.built is False or not model.trainable_variables:
            raise ValueError(f"the model {getattr(model, 'name', type(model).__name__)!r} has no variables yet; "
                             f"build it before creating the Trainer (call it once on a batch, or give it an "
                             f"Input layer), inside strategy.scope()")
        simulate = options.simulate
        if simulate is not None and simulate.active:
            if not options.timing:
                raise ValueError("simulate needs timing=True: its delays are measured like real compute")
            simulate.check(int(strategy.num_replicas_in_sync))
        else:
            options = replace(options, simulate=None)
        self.strategy, self.model, self.optimizer, self.options = strategy, model, optimizer, options
        self.step = ReplicaStep(strategy, model, optimizer, loss_fn, options)
        self.engine = TFEngine(strategy, self.step)
        self.loop = TrainLoop(self.engine, options.compute.accumulate_steps)

    def fit(self, reader, plan: Plan, epochs: int, start: Cursor | None = None, on_step: Callable | None = None,
            on_epoch: Callable | None = None, on_batch: Callable | None = None, guard=None,
            monitor=None) -> list[EpochResult]:
        """Train from ``start`` (default the beginning) up to the end of epoch ``epochs - 1``.

        One distributed pipeline streams many epochs, so there is no pause between them.
        ``start`` may point into the middle of an epoch (resume from a checkpoint's cursor).

        Args:
            reader: a :class:`~evenflow.tf.input.reader.PlanReader` over the training source.
            plan: the training plan; its replicas must match the strategy.
            epochs: the epoch to stop before (like Keras's ``epochs``), > ``start.epoch``.
            start: the :class:`~evenflow.plan.cursor.Cursor` to resume from.
            on_step: optional ``fn(cursor, sums)`` after each update (``accumulate_steps`` plan
                steps): ``sums`` a float32 tensor ``[local replicas, 3]`` (masked loss sum,
                correct predictions, real count). Reading it waits for the step; do it sparingly.
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch.
            on_batch: optional ``fn(cursor, batch)`` with the distributed batch each plan step
                consumed (fetching batches to Python makes every step slower).
            guard: optional :class:`~evenflow.run.guard.TrainingGuard`: checkpoints, audit and the
                anomaly policy; it may rewind training to a checkpoint. With an audit, the run directory
                also gets ``audit/ids.npz`` (``evenflow audit RUN_DIR --locate``).
            monitor: optional :class:`~evenflow.run.monitor.ReplicaMonitor` (needs ``timing``):
                per-replica telemetry and re-plans of the rest of an epoch with measured speeds.

        Returns:
            One :class:`EpochResult` per epoch run (after a rewind, the epochs run last).
        """
        _check_reader(reader, "fit")
        audit_source(guard, reader.source)  # the audit's ids -> rows of the data, or files and records
        # The loop reads ids only for these (TrainLoop._settle); without them the steps leave them out.
        self.engine.with_ids = guard is not None or (monitor is not None and bool(monitor.needs_ids))
        with self.engine.running():
            return self.loop.fit(reader, plan, epochs, start=start, on_step=on_step, on_epoch=on_epoch,
                                 on_batch=on_batch, guard=guard, monitor=monitor)

    def evaluate(self, reader, plan: Plan, epoch: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set)."""
        _check_reader(reader, "evaluate")
        return self.loop.evaluate(reader, plan, epoch)


def _check_reader(reader, method: str) -> None:
    if not callable(getattr(reader, "distribute", None)):
        raise TypeError(f"Trainer.{method} reads through a PlanReader (or a RecordChain), got "
                        f"{type(reader).__name__}; wrap the source: Trainer.{method}(PlanReader(source), plan, ...)")


def _check_parts(strategy, model, optimizer) -> None:
    """Refuse, in one line each, a strategy, model or optimizer the trainer cannot use."""
    tf, keras = _tf(), _keras()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
    try:
        strategy.extended.worker_devices
    except RuntimeError:  # what tf.distribute.get_strategy() returns outside any scope
        raise ValueError("the default tf.distribute strategy has no devices to plan for; create the model and the "
                         "optimizer inside evenflow.tf.mirrored_strategy(1).scope() (one device) or another "
                         "strategy's scope, and pass that strategy") from None
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a Keras optimizer (evenflow.tf.make_optimizer('sgd', 0.1), "
                        f"keras.optimizers.SGD(0.1), ...), got {type(optimizer).__name__}")
