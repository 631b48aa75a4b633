"""A DistributedDataParallel trainer that executes epoch plans with the plan's guarantees.

:class:`Trainer` is a thin front, the PyTorch twin of :class:`evenflow.tf.Trainer`: the DDP
update is :class:`~evenflow.torch.engine.TorchEngine` (masked loss, summed gradients,
accumulation, fp16 gradients, agreed skips of non-finite steps, per-rank timing), and the
loop — epochs, checkpoints, audit and anomaly restores through a
:class:`~evenflow.run.guard.TrainingGuard`, re-plans from measured speeds through a
:class:`~evenflow.run.monitor.ReplicaMonitor`, exact epoch figures — is the framework-neutral
:class:`~evenflow.run.loop.TrainLoop` that TensorFlow runs too.

Every rank runs every step of the plan, padding included, so gradient all-reduces always pair
up: uneven data never hangs and no ``Join`` context is needed. Evaluation all-reduces masked
sums once, so every test sample counts exactly once.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.run.loop import LoopFront, TrainLoop
from evenflow.run.options import COMPRESSIONS, AnomalyOptions, ComputeOptions
from evenflow.run.rerun import rerun_advice
from evenflow.run.results import EpochResult, EvalResult
from evenflow.run.step_options import StepOptions
from evenflow.util.validate import check_accumulate_steps, check_choice
from evenflow.torch.distributed import PeerLostError, is_peer_failure
from evenflow.torch.engine import TorchEngine, TorchReader, check_precision
from evenflow.torch.losses import per_sample_cross_entropy


class Trainer(LoopFront):
    """Trains ``model`` data-parallel with DDP from epoch plans (one process per rank).

    Call after the process group is initialised (:func:`~evenflow.torch.distributed.init_distributed`);
    without one the trainer runs alone (world size 1, no DDP).

    Args:
        model: a ``torch.nn.Module`` mapping features to logits; moved to ``device``.
        optimizer: a ``torch.optim`` optimizer over ``model.parameters()``.
        loss_fn: ``fn(logits, labels) -> [slots]`` per-sample loss; default cross-entropy.
        device: where the model runs (default cpu).
        gradient_sum: ``"ordered"`` (default; bitwise-exact resumes) or ``"ring"``.
        accumulate_steps: plan steps per optimizer update, in ``[1, 64]``.
        compression: ``"none"`` or ``"fp16"`` (the dtype gradients travel in).
        bucket_bytes: DDP bucket size in bytes (0: DDP's default).
        skip_nonfinite: skip, on every rank, an update whose loss or gradients are non-finite.
        timing: time every update (needed by a monitor).
        simulate: a :class:`~evenflow.run.simulate.Simulation` of slow devices (needs ``timing``).
        precision: ``"float32"`` or ``"mixed_bfloat16"``.

    The defaults of ``accumulate_steps``, ``compression``, ``bucket_bytes``, ``skip_nonfinite`` and
    ``precision`` are those of :class:`~evenflow.run.options.ComputeOptions` and
    :class:`~evenflow.run.options.AnomalyOptions` (``evenflow train``'s).
    """

    def __init__(self, model, optimizer, *, loss_fn: Callable = per_sample_cross_entropy, device=None,
                 gradient_sum: str = "ordered", accumulate_steps: int = ComputeOptions.accumulate_steps,
                 compression: str = ComputeOptions.gradient_compression,
                 bucket_bytes: int = ComputeOptions.bytes_per_pack,
                 skip_nonfinite: bool = AnomalyOptions.skip_nonfinite, timing: bool = False, simulate=None,
                 precision: str = ComputeOptions.precision):
        accumulate_steps = check_accumulate_steps(accumulate_steps)
        check_choice("compression", compression, COMPRESSIONS)
        check_precision(precision)
        compute = ComputeOptions(framework="torch", accumulate_steps=accumulate_steps, gradient_compression=compression,
                                 bytes_per_pack=bucket_bytes, precision=precision)
        self._start(model, optimizer, loss_fn, device, gradient_sum,
                    StepOptions(compute, AnomalyOptions(skip_nonfinite=skip_nonfinite), bool(timing), simulate))

    @classmethod
    def from_options(cls, model, optimizer, options: StepOptions, *, device=None,
                     loss_fn: Callable = per_sample_cross_entropy) -> Trainer:
        """A trainer set up by a run's options, whole (what ``evenflow train`` builds); gradients sum in order."""
        trainer = cls.__new__(cls)
        trainer._start(model, optimizer, loss_fn, device, "ordered", options)
        return trainer

    def _start(self, model, optimizer, loss_fn, device, gradient_sum: str, options: StepOptions) -> None:
        simulate = options.simulate
        if simulate is not None and simulate.active:
            if not options.timing:
                raise ValueError("simulate needs timing=True: its delays are measured like real compute")
        else:
            options = replace(options, simulate=None)
        self.engine = TorchEngine(model, optimizer, loss_fn, device, gradient_sum, options)
        if options.simulate is not None:
            options.simulate.check(self.engine.world)
        self.loop = TrainLoop(self.engine, options.compute.accumulate_steps)
        self.model, self.optimizer, self.options = self.engine.model, optimizer, options
        self.rank, self.world_size, self.device = self.engine.rank, self.engine.world, self.engine.device

    def fit(self, source, plan: Plan, epochs: int, start: Cursor | None = None, *, num_workers: int = 0,
            transform: Callable | None = None, on_step: Callable | None = None, on_epoch: Callable | None = None,
            on_batch: Callable | None = None, guard=None, monitor=None) -> list[EpochResult]:
        """Train from ``start`` (default the beginning) to the end of epoch ``epochs - 1``.

        Args:
            source: an evenflow ``Source`` of the training set (or a :class:`~evenflow.torch.engine.TorchReader`,
                which brings its own ``num_workers`` and ``transform``: these two are then refused).
            plan: the training plan; its replicas must equal the world size.
            epochs: the epoch to stop before (like Keras's ``epochs``), > ``start.epoch``.
            start: the cursor to resume from (e.g. a checkpoint's).
            num_workers, transform: ``DataLoader`` workers and a per-batch transform (augmentation).
            on_step: optional ``fn(cursor, sums)`` after each update (``sums`` numpy ``[1, 3]``).
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch (every rank).
            on_batch: optional ``fn(cursor, batch)`` with the batch each step consumed.
            guard: optional :class:`~evenflow.run.guard.TrainingGuard` (checkpoints, audit, anomaly restores).
            monitor: optional :class:`~evenflow.run.monitor.ReplicaMonitor` (needs ``timing``).

        Raises:
            evenflow.torch.PeerLostError: another rank died or stopped answering.
        """
        reader = _reader(source, num_workers, transform)
        self._guard = guard
        try:
            return self.loop.fit(reader, plan, epochs, start=start, on_step=on_step, on_epoch=on_epoch,
                                 on_batch=on_batch, guard=guard, monitor=monitor)
        except RuntimeError as e:
            raise self.peer_error(e) from e

    def evaluate(self, source, plan: Plan, epoch: int = 0, num_workers: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set)."""
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
        reader = _reader(source, num_workers, None)
        try:
            return self.loop.evaluate(reader, plan, epoch)
        except RuntimeError as e:
            raise self.peer_error(e) from e

    def peer_error(self, e: BaseException, run_dir=None) -> BaseException:
        """A :class:`PeerLostError` naming where training stopped, for a collective that lost a rank.

        It ends with what a rerun does (:func:`~evenflow.run.rerun.rerun_advice`): resume from the
        newest checkpoint in ``run_dir`` (default: the directory of the guard :meth:`fit` was given),
        else start over.
        """
        if self.world_size == 1 or isinstance(e, PeerLostError) or not is_peer_failure(e):
            return e
        cursor = self.loop.cursor
        where = f"Cursor({cursor.epoch}, {cursor.step})" if cursor is not None else "start-up"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        guard = getattr(self, "_guard", None)
        if run_dir is None and guard is not None:
            run_dir = guard.checkpointer.run_dir
        return PeerLostError(f"rank {self.rank} of {self.world_size} lost contact with another rank after {where} "
                             f"({first[:200]}); {rerun_advice(run_dir)}")


def _reader(source, num_workers: int, transform) -> TorchReader:
    """``source`` read with these workers and transform; a ``TorchReader`` brings its own, so none may be given."""
    if not isinstance(source, TorchReader):
        return TorchReader(source, num_workers, transform)
    given = [f"{name}={value!r}" for name, value, unset in (("num_workers", num_workers, 0),
                                                            ("transform", transform, None)) if value != unset]
    if given:
        raise ValueError(f"{', '.join(given)}: a TorchReader brings its own loader workers and transform; set them "
                         f"on the TorchReader, or pass its source instead")
    return source
