"""A custom-loop data-parallel trainer that executes epoch plans with ``tf.distribute``.

The custom loop is the main path because Keras 3's ``model.fit`` does not work
under MultiWorkerMirroredStrategy (keras-team/keras#20585) and because the loop
is where the plan's guarantees turn into arithmetic:

* each replica's loss is :func:`~evenflow.tf.losses.masked_loss`, its masked sum
  divided by the step's global real count;
* Keras 3's optimizer, called in replica context, all-reduces the gradients with
  ``ReduceOp.SUM`` (``TFOptimizer._all_reduce_sum_gradients``) before applying
  them, so the update is the gradient of the mean over the step's real samples —
  the same for any number of replicas (``tests/tf/test_world_size.py``);
* evaluation sums masked losses and hits over a plan of the test set, so every
  test sample counts exactly once.

The loop is single-worker today (MirroredStrategy; the reader's PER_REPLICA input
mode is local-only); a multi-worker strategy needs each worker to build the
pipelines of its own replicas, which is the next step, not done here.

:meth:`Trainer.fit` runs a :class:`~evenflow.plan.plan.Plan` for a number of epochs,
possibly starting mid-epoch from a :class:`~evenflow.plan.cursor.Cursor`; the
trainer's ``cursor`` always says how far training got (what a checkpoint stores).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evenflow.plan import Cursor, Plan
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.losses import masked_loss, per_sample_cross_entropy

__all__ = ["Trainer", "EpochResult", "EvalResult", "OPTIMIZERS", "make_optimizer", "CHUNK_SLOTS"]

# Most plan slots (ids) one training pipeline holds: 2**23 int64 ids = 64 MiB of host memory.
CHUNK_SLOTS = 2**23

OPTIMIZERS: dict[str, Callable] = {
    "adam": lambda keras, lr: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda keras, lr: keras.optimizers.SGD(learning_rate=lr),
}


def make_optimizer(name: str, learning_rate: float, precision: str = "float32"):
    """A Keras optimizer by name; wrapped for dynamic loss scaling under ``mixed_float16``.

    Call it inside ``strategy.scope()``: the optimizer remembers the strategy it was
    created under and all-reduces gradients through it.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(sorted(OPTIMIZERS))}, got {name!r}")
    keras = _keras()
    opt = OPTIMIZERS[name](keras, float(learning_rate))
    if precision == "mixed_float16":
        # float16 gradients underflow without loss scaling; bfloat16 has float32's range and needs none.
        opt = keras.optimizers.LossScaleOptimizer(opt)
    return opt


@dataclass(frozen=True)
class EpochResult:
    """What one epoch of :meth:`Trainer.fit` did.

    Attributes:
        epoch: epoch number.
        steps: global steps run.
        samples: real samples trained on, counted from the masks of the batches consumed.
        loss: mean loss over those samples (each computed before its step's update).
        accuracy: fraction of them classified correctly (before each step's update).
        seconds: wall time of the epoch's steps, first step's start to last step's end.
        replica_samples: real samples each replica trained on, from its masks.
    """

    epoch: int
    steps: int
    samples: int
    loss: float
    accuracy: float
    seconds: float
    replica_samples: tuple[int, ...] = ()

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class EvalResult:
    """Exact metrics over an evaluation plan: ``count`` is the number of samples seen."""

    count: int
    loss: float
    accuracy: float


class Trainer:
    """Trains ``model`` data-parallel under ``strategy`` from epoch plans.

    Build the model and optimizer inside ``strategy.scope()`` before creating
    the trainer.

    Args:
        strategy: a ``tf.distribute`` strategy (MirroredStrategy for one worker).
        model: a ``keras.Model`` mapping features to logits.
        optimizer: a Keras 3 optimizer (a ``LossScaleOptimizer`` for ``mixed_float16``).
        loss_fn: ``fn(labels, logits) -> [slots]`` per-sample loss; default softmax
            cross-entropy.
    """

    def __init__(self, strategy, model, optimizer, loss_fn=per_sample_cross_entropy):
        tf = _tf()
        keras = _keras()
        self.strategy, self.model, self.optimizer, self.loss_fn = strategy, model, optimizer, loss_fn
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        with strategy.scope():
            # Create the slot variables now, in cross-replica context, not lazily inside strategy.run.
            optimizer.build(model.trainable_variables)
        self.cursor: Cursor | None = None
        self._train_step = tf.function(self._distributed_train_step)
        self._eval_step = tf.function(self._distributed_eval_step)
        # The same steps taking the iterator: next() inside the function saves the Python-side
        # get_next of R per-replica iterators (+37% steps/s measured on 4 logical CPUs).
        self._train_next = tf.function(lambda iterator: self._distributed_train_step(next(iterator)))
        self._eval_next = tf.function(lambda iterator: self._distributed_eval_step(next(iterator)))

    # -- per-replica computations -------------------------------------------------------
    def _replica_train(self, batch):
        tf = _tf()
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(batch["features"], training=True)
            per_sample = self.loss_fn(batch["label"], logits)
            loss = masked_loss(per_sample, batch["mask"], batch["global_real_count"])
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        if self._loss_scaled:
            grads = self._agree_on_finite(grads)
        self.optimizer.apply(grads, variables)
        return self._sums(batch, logits, per_sample)

    def _agree_on_finite(self, grads):
        # LossScaleOptimizer decides "skip this step" from replica 0's *local* gradients; a float16
        # overflow on another replica alone would then be summed into the weights. Make the local
        # verdicts agree first: if any replica overflowed, every replica presents non-finite grads.
        tf = _tf()
        ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        ctx = tf.distribute.get_replica_context()
        # ReduceOp has only SUM and MEAN: count the replicas that overflowed.
        all_ok = ctx.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(ok, tf.float32)) == 0
        return [tf.where(all_ok, g, tf.constant(np.nan, g.dtype)) for g in grads]

    @staticmethod
    def _sums(batch, logits, per_sample):
        # Unnormalised sums [loss, hits, real count] in one vector: summed over replicas and steps
        # on the host they give exact epoch totals without the host knowing each step's count.
        tf = _tf()
        mask = batch["mask"]
        real = mask > 0
        per_sample = tf.cast(per_sample, tf.float32)
        pred = tf.argmax(logits, axis=-1, output_type=tf.int64)
        right = tf.equal(pred, tf.cast(batch["label"], tf.int64))
        return tf.stack([tf.reduce_sum(tf.where(real, per_sample, tf.zeros_like(per_sample))),
                         tf.reduce_sum(tf.cast(tf.logical_and(right, real), tf.float32)),
                         tf.reduce_sum(mask)])

    def _replica_eval(self, batch):
        logits = self.model(batch["features"], training=False)
        return self._sums(batch, logits, self.loss_fn(batch["label"], logits))

    # -- distributed steps (traced once per batch structure) ------------------------------
    def _distributed_train_step(self, batch):
        return self._gather(self.strategy.run(self._replica_train, args=(batch,)))

    def _distributed_eval_step(self, batch):
        return self._gather(self.strategy.run(self._replica_eval, args=(batch,)))

    def _gather(self, per_replica):
        # Stack instead of strategy.reduce: the host gets the per-replica rows (real counts per
        # replica for the balance log) and sums them itself, with no cross-device reduction.
        tf = _tf()
        return tf.stack(self.strategy.experimental_local_results(per_replica))

    # -- loops ---------------------------------------------------------------------------
    def fit(self, reader, plan: Plan, epochs: int, start: Cursor | None = None,
            on_step: Callable | None = None, on_epoch: Callable | None = None,
            on_batch: Callable | None = None) -> list[EpochResult]:
        """Train from ``start`` (default the beginning) up to the end of epoch ``epochs - 1``.

        One distributed pipeline streams many epochs (as many as fit in
        :data:`CHUNK_SLOTS` planned ids), so there is no pause between them.
        ``start`` may point into the middle of an epoch (resume from a checkpoint's
        cursor); that epoch then runs its remaining steps only.

        Args:
            reader: a :class:`~evenflow.tf.reader.PlanReader` over the training source.
            plan: the training plan; its replicas must match the strategy.
            epochs: the epoch to stop before (like Keras's ``epochs``), > ``start.epoch``.
            start: the :class:`~evenflow.plan.cursor.Cursor` to resume from.
            on_step: optional ``fn(cursor, sums)`` after each step: ``cursor`` is the
                position after the step, ``sums`` a float32 tensor ``[replicas, 3]``: per
                replica the masked loss sum, the correct predictions and the real count.
                Reading it (``.numpy()``) waits for the step to finish; do it sparingly.
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch.
            on_batch: optional ``fn(cursor, batch)`` with the distributed batch each step
                consumed (e.g. to log the ids each replica received). Fetching batches to
                Python makes every step slower, so only pass it when you need it.

        Returns:
            One :class:`EpochResult` per epoch run.
        """
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor, got {type(start).__name__}")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= start.epoch:
            raise ValueError(f"epochs must be an int greater than the start epoch {start.epoch}, got {epochs!r}")
        # Epochs are read in chunks of planned rows (see PlanReader), at most CHUNK_SLOTS ids each:
        # all of a small dataset's epochs in one pipeline, one epoch per pipeline for a large one.
        per_epoch = max(plan.num_steps * plan.topology.replicas * plan.slots, 1)
        chunk = max(1, CHUNK_SLOTS // per_epoch)
        results: list[EpochResult] = []
        for first_epoch in range(start.epoch, epochs, chunk):
            last = min(first_epoch + chunk, epochs)
            cursor = start if first_epoch == start.epoch else Cursor(first_epoch, 0)
            stream = iter(reader.distribute(self.strategy, plan, start=cursor, epochs=last - first_epoch))
            for epoch in range(first_epoch, last):
                first = cursor.step if epoch == cursor.epoch else 0
                results.append(self._run_epoch(stream, plan, epoch, first, on_step, on_batch))
                if on_epoch is not None:
                    on_epoch(results[-1])
            _drain(stream)
        return results

    def _run_epoch(self, stream, plan: Plan, epoch: int, first: int, on_step, on_batch) -> EpochResult:
        # Step sums stay tensors until the epoch ends: reading one back every step would make
        # the host wait for each step before dispatching the next (a GPU would idle).
        pending = []
        self.cursor = Cursor(epoch, first)
        began = time.perf_counter()
        for step in range(first, plan.num_steps):
            if on_batch is None:
                sums = self._train_next(stream)
            else:
                batch = next(stream)
                sums = self._train_step(batch)
            pending.append(sums)
            self.cursor = Cursor(epoch, step + 1)
            if on_batch is not None:
                on_batch(self.cursor, batch)
            if on_step is not None:
                on_step(self.cursor, sums)
        totals = np.zeros((self.strategy.num_replicas_in_sync, 3))
        for t in pending:
            totals += t.numpy()
        seconds = time.perf_counter() - began
        loss_sum, hits, n = totals.sum(axis=0)
        n = int(round(n))
        return EpochResult(epoch=epoch, steps=plan.num_steps - first, samples=n,
                           loss=float(loss_sum) / max(n, 1), accuracy=float(hits) / max(n, 1),
                           seconds=seconds, replica_samples=tuple(int(round(c)) for c in totals[:, 2]))

    def evaluate(self, reader, plan: Plan, epoch: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set).

        Every sample of the plan's index is counted exactly once. Each call reads one
        bounded pipeline to its end (~0.1-0.3 s of start-up on the 2-core machine).
        """
        stream = iter(reader.distribute(self.strategy, plan, start=Cursor(epoch, 0), epochs=1))
        totals = np.zeros(3)
        for _ in range(plan.num_steps):
            totals += self._eval_next(stream).numpy().sum(axis=0)
        _drain(stream)
        n = int(round(totals[2]))
        return EvalResult(count=n, loss=float(totals[0]) / max(n, 1), accuracy=float(totals[1]) / max(n, 1))


def _drain(stream) -> None:
    """Read a finished stream to its end before it is deleted.

    Deleting an iterator waits for its in-flight work with the GIL held; a source
    that runs Python in the pipeline (``tf.numpy_function``) could then deadlock.
    At the end of the stream nothing is in flight.
    """
    for _ in stream:
        raise RuntimeError("the input pipeline yielded more batches than the plan has steps; "
                           "please report this as a bug")
