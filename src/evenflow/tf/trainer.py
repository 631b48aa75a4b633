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

The same loop runs one worker (MirroredStrategy) or several
(MultiWorkerMirroredStrategy, :func:`~evenflow.tf.strategy.make_strategy`): each
worker reads the rows of its own replicas from the same plan, every replica runs
the plan's equal number of steps, and the per-replica sums of an epoch are
all-gathered once at its end, so every worker reports the same global figures.

Less communication, both optional:

* ``accumulate_steps=k``: one optimizer update (and one gradient all-reduce) per
  k plan steps. Each micro-step's masked loss is divided by the real count of all
  k steps together, so the summed gradient is the gradient of the mean over the
  union of their samples — the update one step over those samples would make.
  Groups start at multiples of k within an epoch (a run resumed at a group boundary
  groups the same way); an epoch's last group may be shorter. Cursors handed to
  ``on_step`` and guards are always at group boundaries.
* ``compression="fp16"``: gradients are cast to float16 for the all-reduce (half
  the bytes) and back to the variables' dtype; the trainer then does the all-reduce
  itself and switches off the optimizer's own.

:meth:`Trainer.fit` runs a :class:`~evenflow.plan.plan.Plan` for a number of epochs,
possibly starting mid-epoch from a :class:`~evenflow.plan.cursor.Cursor`; the
trainer's ``cursor`` always says how far training got (what a checkpoint stores).

Fault tolerance: a step that is non-finite on any replica is skipped everywhere
(``skip_nonfinite``; the verdict is agreed by an all-reduce before the update), and
each step returns, besides its sums, the ids its replicas trained on and its flags,
which a :class:`~evenflow.tf.guard.TrainingGuard` passed to ``fit`` turns into
crash-safe checkpoints, the audit trail and restores after runs of non-finite steps.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evenflow.plan import Cursor, Plan, Topology
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.losses import masked_loss, per_sample_cross_entropy
from evenflow.tf.pyfunc import wall_clock
from evenflow.tf.strategy import num_workers, on_cpu

__all__ = ["Trainer", "EpochResult", "EvalResult", "OPTIMIZERS", "COMPRESSIONS", "make_optimizer", "CHUNK_SLOTS",
           "MAX_ACCUMULATE_STEPS"]

# Most plan slots (ids) one training pipeline holds: 2**23 int64 ids = 64 MiB of host memory.
CHUNK_SLOTS = 2**23
# With a guard or monitor, the host reads each step's outputs this many steps behind the newest
# dispatched one on accelerators: anomalies are seen promptly without making the host wait for every
# step. On CPU devices a step's call returns only once the step has run, so its outputs are read at
# once (lag 0): nothing overlaps anyway, and the speed monitor re-plans two updates sooner (a replica
# 2x slow from the start re-plans after update 2 instead of 4).
LAG = 2
# Python's GIL switch interval while timed steps run (see Trainer.fit), seconds.
TIMING_SWITCH_SECONDS = 0.0005

# Gradient compression before the all-reduce: the dtype the gradients travel in.
COMPRESSIONS: tuple[str, ...] = ("none", "fp16")
# The k micro-steps of an update are unrolled in one traced function; past a few dozen the
# trace gets slow, and a larger effective batch is better had from a larger global batch.
MAX_ACCUMULATE_STEPS = 64

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
        seconds: wall time of the epoch's steps, first step's start to last step's end
            (summed over the processes that ran parts of it, after a resume).
        replica_samples: real samples each replica trained on, from its masks (after an
            elastic resume mid-epoch: only those of the current replicas, since the resume).
        skipped_steps: steps whose update was skipped as non-finite (their samples are not
            counted in ``samples``, ``loss`` and ``accuracy``).
    """

    epoch: int
    steps: int
    samples: int
    loss: float
    accuracy: float
    seconds: float
    replica_samples: tuple[int, ...] = ()
    skipped_steps: int = 0

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

    A step whose loss or gradients are non-finite on any replica (the replicas
    agree through one all-reduce of a flag) is skipped as a whole when
    ``skip_nonfinite`` is on: no variable changes, not even the optimizer's step
    count. Under ``mixed_float16`` the loss-scale optimizer skips gradient
    overflows itself; a non-finite *loss* is still reported as an anomaly.

    Args:
        strategy: a ``tf.distribute`` strategy (MirroredStrategy for one worker).
        model: a ``keras.Model`` mapping features to logits.
        optimizer: a Keras 3 optimizer (a ``LossScaleOptimizer`` for ``mixed_float16``).
        loss_fn: ``fn(labels, logits) -> [slots]`` per-sample loss; default softmax
            cross-entropy.
        skip_nonfinite: skip the update of a step that is non-finite on any replica.
        accumulate_steps: plan steps per optimizer update, in ``[1, 64]`` (see the
            module docstring); 1 updates every step.
        compression: ``"none"`` or ``"fp16"``: the dtype gradients are all-reduced in.
            float16 overflows beyond +-65504 (a non-finite update, skipped like any
            other) and flushes magnitudes below ~6e-8 to zero.
    """

    def __init__(self, strategy, model, optimizer, loss_fn=per_sample_cross_entropy, skip_nonfinite: bool = True,
                 accumulate_steps: int = 1, compression: str = "none", timing: bool = False, simulate=None):
        tf = _tf()
        keras = _keras()
        if isinstance(accumulate_steps, bool) or not isinstance(accumulate_steps, int) \
                or not 1 <= accumulate_steps <= MAX_ACCUMULATE_STEPS:
            raise ValueError(f"accumulate_steps must be an int in [1, {MAX_ACCUMULATE_STEPS}], got "
                             f"{accumulate_steps!r}; use a larger global batch for larger updates")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        self.strategy, self.model, self.optimizer, self.loss_fn = strategy, model, optimizer, loss_fn
        self.skip_nonfinite = bool(skip_nonfinite)
        self.accumulate_steps, self.compression = accumulate_steps, compression
        if simulate is not None and simulate.active:
            if not timing:
                raise ValueError("simulate needs timing=True: its delays are measured like real compute")
            simulate.check(int(strategy.num_replicas_in_sync))
        self.timing, self.simulate = bool(timing), simulate if simulate is not None and simulate.active else None
        # The plan fit() runs now: the one passed in, or a re-plan with measured weights.
        self.plan: Plan | None = None
        self.replans: list[tuple[Cursor, tuple[float, ...]]] = []
        self._decided = None  # a monitor decision with new weights, not applied yet
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        # This worker's replicas, and the worker count (1 under MirroredStrategy).
        self._local = len(strategy.extended.worker_devices)
        self._workers = num_workers(strategy)
        self._lag = 0 if on_cpu(strategy) else LAG
        if compression != "none":
            _skip_optimizer_all_reduce(optimizer)
        with strategy.scope():
            # Create the slot variables now, in cross-replica context, not lazily inside strategy.run.
            optimizer.build(model.trainable_variables)
            # Per-replica clock anchor: timing callbacks take its local handle as a resource input, which
            # keeps TensorFlow's automatic control dependencies from chaining every replica's callbacks
            # into one sequence (stateful ops without a resource input run in program order, which would
            # time replica 1 only after replica 0 finished and make emulated delays add up, not overlap).
            self._anchor = tf.Variable(0.0, trainable=False, name="evenflow_clock") if self.timing else None
        self.cursor: Cursor | None = None
        # autograph=False: the steps branch with tf.cond only (never `if tensor:`), and skipping
        # AutoGraph's source conversion makes the first call (the trace) 35-70% faster, measured
        # on the 2-core machine (3.0 -> 2.0 s and 5.6 -> 1.5 s under load) — paid by every process.
        # reduce_retracing: batches passed in from Python carry their concrete shapes, and variable-length
        # batches (evenflow.tf.text) would otherwise retrace for every new length; relaxed to None after one.
        self._train_step = tf.function(self._distributed_train_step, autograph=False, reduce_retracing=True)
        self._eval_step = tf.function(self._distributed_eval_step, autograph=False, reduce_retracing=True)
        # The same steps taking the iterator: next() inside the function saves the Python-side
        # get_next of R per-replica iterators (+37% steps/s measured on 4 logical CPUs).
        # `count` (micro-steps of one update) is a Python int: one trace per group length (k, and
        # an epoch's shorter last group).
        self._train_next = tf.function(self._train_from, autograph=False)
        self._eval_next = tf.function(lambda iterator: self._distributed_eval_step(next(iterator)), autograph=False)
        self._all_gather = tf.function(lambda values: strategy.gather(values, axis=0))

    # -- per-replica computations -------------------------------------------------------
    def _replica_train(self, *batches, clock=None, step=None):
        # One update from the plan steps `batches` (one, without accumulation); returns one output
        # dict per step. Every step's masked sum is divided by the real count of all of them, so
        # the summed gradient is that of the mean over their union.
        # With timing, `clock` is [step began, input ready] and `step` the run's global plan step.
        tf = _tf()
        variables = self.model.trainable_variables
        if self.timing:
            t_start = self._stamp([b["mask"] for b in batches])
        count = batches[0]["global_real_count"] if len(batches) == 1 else \
            tf.add_n([tf.cast(b["global_real_count"], tf.float32) for b in batches])
        grads, loss, seen = None, None, []
        for batch in batches:
            with tf.GradientTape() as tape:
                logits = self.model(batch["features"], training=True)
                per_sample = self.loss_fn(batch["label"], logits)
                step_loss = masked_loss(per_sample, batch["mask"], count)
                scaled = self.optimizer.scale_loss(step_loss) if self._loss_scaled else step_loss
            step_grads = tape.gradient(scaled, variables)
            grads = step_grads if grads is None else [a + b for a, b in zip(grads, step_grads)]
            loss = step_loss if loss is None else loss + step_loss
            seen.append((batch, logits, per_sample))
        if self.timing:
            # Gradients ready, plus the emulated device's delay if simulating (one callback for both).
            t_done = self._stamp([g for g in grads if g is not None] + [loss], since=t_start,
                                 **self._slowdown(batches, step))
            if self.simulate is not None:
                with tf.control_dependencies([t_done]):  # the update waits for the emulated device
                    grads = [None if g is None else tf.identity(g) for g in grads]
        # One all-reduce makes every replica (and worker) see the same verdicts, so all of them take
        # the same branch below: a step skipped on one replica and applied on another would
        # desynchronise the weights, or hang a collective inside the update. (ReduceOp has only SUM
        # and MEAN: count the replicas whose loss, resp. gradients, are non-finite.)
        local_bad = tf.stack([1.0 - tf.cast(tf.math.is_finite(loss), tf.float32),
                              1.0 - tf.cast(_all_finite(grads), tf.float32)])
        bad_replicas = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local_bad)
        loss_bad, grads_bad = bad_replicas[0] > 0, bad_replicas[1] > 0
        if self.compression == "fp16":
            # On every replica, before the branches below: a collective inside one would hang. The
            # sums are the same on every replica, so a float16 overflow in them is an agreed verdict.
            grads = self._all_reduce_fp16(grads)
            grads_bad = tf.logical_or(grads_bad, tf.logical_not(_all_finite(grads)))
        if self._loss_scaled:
            grads = self._agree_on_finite(grads, grads_bad)
            self.optimizer.apply(grads, variables)
            anomaly, skipped = loss_bad, grads_bad
        elif self.skip_nonfinite:
            anomaly = skipped = tf.logical_or(loss_bad, grads_bad)
            self._apply_unless(skipped, grads, variables)
        else:
            self.optimizer.apply(grads, variables)
            anomaly, skipped = tf.logical_or(loss_bad, grads_bad), tf.constant(False)
        # flags: [this replica non-finite, step anomalous on some replica, update skipped everywhere]
        flags = tf.stack([tf.reduce_max(local_bad), tf.cast(anomaly, tf.float32), tf.cast(skipped, tf.float32)])
        outs = [dict(self._outputs(*s), flags=flags) for s in seen]
        if self.timing:
            # [step began, input ready, replica started, gradients ready] (host clock, seconds); the
            # step's end is stamped after all replicas (see _distributed_train_step).
            outs[-1]["timing"] = tf.concat([tf.cast(clock, tf.float64), tf.stack([t_start, t_done])], 0)
        return tuple(outs)

    def _stamp(self, after, since=None, factor=None, sample_seconds=None):
        """The host clock (seconds, float64) once ``after`` are computed.

        With ``since`` (this replica's start) and a slowdown, first sleeps until
        ``since + factor * max(now - since, sample_seconds)``: the emulated device (see
        :func:`_clock`).
        """
        tf = _tf()
        zero, one = tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64)
        args = [self._anchor.handle, zero if since is None else since, one if factor is None else factor,
                zero if sample_seconds is None else sample_seconds]
        with tf.control_dependencies(after):
            return tf.ensure_shape(tf.py_function(_clock, args, tf.float64), [])

    def _slowdown(self, batches, step) -> dict:
        # The emulated slowdown of this replica at global step `step` (see evenflow.tf.simulate).
        tf = _tf()
        sim = self.simulate
        if sim is None:
            return {}
        rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        factor = tf.constant(1.0, tf.float64)
        for slow in sim.slow:
            hit = tf.logical_and(tf.equal(rid, slow.replica), step >= slow.from_step)
            factor = factor * tf.where(hit, tf.constant(slow.factor, tf.float64), tf.constant(1.0, tf.float64))
        real = tf.add_n([tf.reduce_sum(tf.cast(b["mask"], tf.float64)) for b in batches])
        return {"factor": factor, "sample_seconds": (sim.sample_ms / 1000.0) * real}

    def _all_reduce_fp16(self, grads):
        # Sum over all replicas in float16 (half the bytes on the wire), back in the variables' dtype.
        tf = _tf()
        grads = [tf.convert_to_tensor(g) for g in grads]
        summed = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.cast(g, tf.float16) for g in grads])
        return [tf.cast(s, g.dtype) for s, g in zip(summed, grads)]

    @staticmethod
    def _agree_on_finite(grads, any_bad):
        # LossScaleOptimizer decides "skip this step" from replica 0's *local* gradients; a float16
        # overflow on another replica alone would then be summed into the weights. Make the local
        # verdicts agree first: if any replica overflowed, every replica presents non-finite grads.
        tf = _tf()
        return [tf.where(any_bad, tf.constant(np.nan, g.dtype), g) for g in grads]

    def _apply_unless(self, skip, grads, variables):
        """Apply ``grads`` on every replica unless the agreed ``skip`` is true (the same on all)."""
        tf = _tf()

        def apply(g):
            self.optimizer.apply(g, variables)
            return tf.constant(True)

        def keep():
            return tf.constant(False)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            # MultiWorkerMirroredStrategy: the optimizer never merge_calls, so a cond in replica
            # context works; its collectives run on every replica or on none (skip is agreed).
            tf.cond(skip, keep, lambda: apply(grads))
            return

        # MirroredStrategy: the optimizer merge_calls, which a cond branch in replica context must
        # not do; branch in cross-replica context instead (as Keras's LossScaleOptimizer does).
        def cross(distribution, skip, grads):
            first = distribution.experimental_local_results(skip)[0]
            return tf.cond(first, keep, lambda: (distribution.extended.call_for_each_replica(
                apply, args=(grads,)), tf.constant(True))[1])

        tf.distribute.get_replica_context().merge_call(cross, args=(skip, grads))

    def _outputs(self, batch, logits, per_sample) -> dict:
        # What the host learns about a step: the sums, and for audits and anomaly reports the ids
        # the replica actually received, its slots with a non-finite loss and its global replica id.
        tf = _tf()
        ctx = tf.distribute.get_replica_context()
        return {"sums": self._sums(batch, logits, per_sample), "ids": batch["id"],
                "nonfinite": tf.logical_and(batch["mask"] > 0, _suspects(batch["features"], logits, per_sample)),
                "replica": tf.cast(ctx.replica_id_in_sync_group, tf.int64)}

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
    def _distributed_train_step(self, *batches, clock=None, step=None):
        """One update from ``batches`` (consecutive plan steps): a tuple of one output dict per step."""
        tf = _tf()
        kwargs = {}
        if self.timing:
            if clock is None:
                now = _now()
                clock = tf.stack([now, now])
            kwargs = {"clock": clock, "step": tf.constant(0, tf.int64) if step is None else step}
        outs = self._gather(self.strategy.run(self._replica_train, args=batches, kwargs=kwargs))
        if self.timing:
            # The step's end, once every replica's outputs (after the update) exist: one column more.
            with tf.control_dependencies(tf.nest.flatten(outs)):
                end = _now()
            timing = outs[-1]["timing"]
            outs[-1]["timing"] = tf.concat([timing, tf.fill([tf.shape(timing)[0], 1], end)], 1)
        return outs

    def _train_from(self, iterator, count=1, step=None):
        # The update from the next `count` batches of `iterator`, timing how long they took to arrive.
        tf = _tf()
        began = _now() if self.timing else None
        batches = [next(iterator) for _ in range(count)]
        clock = None
        if self.timing:
            if "produced" in batches[0]:
                # A stamped pipeline (PlanReader(stamp=True)) says when each batch was made: the step
                # waited only for those made after it began. A clock callback run once the batches
                # have arrived measures more: it queues behind the replicas' first ops on the
                # inter-op threads. On digits (4 logical CPUs, 2 cores) it reported 70% of the step
                # time as input wait even with 64 batches prefetched per replica.
                made = [t for b in batches for t in self.strategy.experimental_local_results(b["produced"])]
                clock = tf.stack([began, tf.maximum(began, tf.reduce_max(tf.stack(made)))])
            else:
                arrived = [t for b in batches for t in self.strategy.experimental_local_results(b["mask"])]
                with tf.control_dependencies(arrived):
                    clock = tf.stack([began, _now()])
        return self._distributed_train_step(*batches, clock=clock, step=step)

    def _distributed_eval_step(self, batch):
        return self._gather(self.strategy.run(self._replica_eval, args=(batch,)))

    def _gather(self, per_replica):
        # Stack instead of strategy.reduce: the host gets the per-replica rows (real counts per
        # replica for the balance log) and sums them itself, with no cross-device reduction.
        # A dict of outputs is stacked key by key: [local replicas, ...] each.
        tf = _tf()
        return tf.nest.map_structure(lambda t: _stack_padded(self.strategy.experimental_local_results(t)),
                                     per_replica)

    def gather_rows(self, local_rows: np.ndarray) -> np.ndarray:
        """All workers' float64 rows: ``[local replicas, k]`` -> ``[all replicas, k]`` (a collective)."""
        return self._all_workers(local_rows)

    def _all_workers(self, local_rows: np.ndarray) -> np.ndarray:
        """float64 ``[local replicas, k]`` rows -> ``[all replicas, k]``, in global replica order.

        One all-gather across the workers: a collective, so every worker must call it
        at the same point of its loop. A single worker gets its rows back unchanged.
        """
        if self._workers == 1:
            return local_rows
        tf = _tf()
        local_rows = np.asarray(local_rows, dtype=np.float64)
        # Worker w holds the global replicas w * R .. w * R + R - 1.
        values = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(local_rows[ctx.replica_id_in_sync_group % self._local][None]))
        return self._all_gather(values).numpy()

    # -- loops ---------------------------------------------------------------------------
    def fit(self, reader, plan: Plan, epochs: int, start: Cursor | None = None,
            on_step: Callable | None = None, on_epoch: Callable | None = None,
            on_batch: Callable | None = None, guard=None, monitor=None) -> list[EpochResult]:
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
            on_step: optional ``fn(cursor, sums)`` after each step (each update: a group of
                ``accumulate_steps`` plan steps): ``cursor`` is the position after it,
                ``sums`` a float32 tensor ``[local replicas, 3]``: per replica of this
                worker the masked loss sum, the correct predictions and the real count.
                Reading it (``.numpy()``) waits for the step to finish; do it sparingly.
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch.
            on_batch: optional ``fn(cursor, batch)`` with the distributed batch each plan
                step consumed (e.g. to log the ids each replica received), ``cursor`` the
                position after that step. Fetching batches to Python makes every step
                slower, so only pass it when you need it.
            guard: optional :class:`~evenflow.tf.guard.TrainingGuard`: checkpoints, audit
                and the anomaly policy, called after every step. It may rewind training to
                a checkpoint; the epochs after that point are then run again.
            monitor: optional :class:`~evenflow.tf.monitor.ReplicaMonitor` (needs a trainer
                with ``timing=True``): per-replica telemetry, and re-plans of the rest of
                an epoch with measured speeds (``plan.with_topology``): the same samples,
                each still once, split in other proportions. :attr:`plan` is the plan in
                use at the end, :attr:`replans` lists (cursor, weights) of each re-plan.

        Returns:
            One :class:`EpochResult` per epoch run (after a rewind, the epochs run last).
        """
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor, got {type(start).__name__}")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= start.epoch:
            raise ValueError(f"epochs must be an int greater than the start epoch {start.epoch}, got {epochs!r}")
        if monitor is not None and not self.timing:
            raise ValueError("a monitor needs per-replica timings: create the Trainer with timing=True")
        if monitor is not None and not plan.topology.is_uniform and monitor.weights != plan.topology.weights:
            monitor.rebalancer.weights = tuple(float(w) for w in plan.topology.weights)
        self.plan = plan
        # The clock callbacks of timed steps run Python on TensorFlow's threads; while this
        # thread runs Python (settling steps, telemetry), they wait for the GIL, by default up
        # to 5 ms per hand-over. A 0.5 ms switch interval cut that wait: digits at 4 replicas
        # on the 2-core reference machine ran 4,169 -> 5,579 samples/s (medians of 7 epochs).
        switch = sys.getswitchinterval()
        if self.timing:
            sys.setswitchinterval(min(switch, TIMING_SWITCH_SECONDS))
        try:
            return self._fit(reader, plan, epochs, start, on_step, on_epoch, on_batch, guard, monitor)
        finally:
            sys.setswitchinterval(switch)

    def _fit(self, reader, plan, epochs, start, on_step, on_epoch, on_batch, guard, monitor) -> list[EpochResult]:
        results: list[EpochResult] = []
        cursor, carry = start, None
        while cursor.epoch < epochs:
            # Epochs are read in chunks of planned rows (see PlanReader), at most CHUNK_SLOTS ids each:
            # all of a small dataset's epochs in one pipeline, one epoch per pipeline for a large one.
            per_epoch = max(self.plan.num_steps * self.plan.topology.replicas * self.plan.slots, 1)
            last = min(cursor.epoch + max(1, CHUNK_SLOTS // per_epoch), epochs)
            stream = iter(reader.distribute(self.strategy, self.plan, start=cursor, epochs=last - cursor.epoch))
            rewind = replan = None
            for epoch in range(cursor.epoch, last):
                first = cursor.step if epoch == cursor.epoch else 0
                outcome = self._run_epoch(stream, self.plan, epoch, first, on_step, on_batch, guard, monitor, carry)
                carry = None
                if isinstance(outcome, Cursor):
                    rewind = outcome
                    break
                if isinstance(outcome, _Replan):
                    replan = outcome
                    break
                results.append(outcome)
                if on_epoch is not None:
                    on_epoch(outcome)
                if self._decided is not None and epoch + 1 < epochs:  # decided at the epoch's end: re-plan the next
                    replan = _Replan(Cursor(epoch + 1, 0), None)
                    break
                self._decided = None
            if rewind is None and replan is None:
                _drain(stream)
                cursor = Cursor(last, 0)
                continue
            # Rewound or re-planned: drop the stream mid-way. Safe here, unlike an endless stream,
            # because its rows are constants (no Python work in flight; see PlanReader).
            del stream
            if replan is not None:
                cursor, carry = replan.cursor, replan.tally
                self._adopt(plan, cursor, monitor)
                if guard is not None:  # checkpoints from here on carry the new weights
                    guard.weights = tuple(self.plan.topology.weights)
                continue
            results = [r for r in results if r.epoch < rewind.epoch]
            cursor = self.cursor = rewind
        if guard is not None:
            guard.finish(cursor)
        return results

    def _adopt(self, plan: Plan, cursor: Cursor, monitor) -> None:
        """Switch to the weights decided by the monitor, from ``cursor`` on."""
        decision, self._decided = self._decided, None
        before = tuple(self.plan.topology.weights or (1.0,) * self.plan.topology.replicas)
        self.plan = plan.with_topology(Topology(plan.topology.replicas, decision.weights))
        self.replans.append((cursor, decision.weights))
        monitor.replanned(cursor, before, decision)

    def _run_epoch(self, stream, plan: Plan, epoch: int, first: int, on_step, on_batch, guard, monitor=None,
                   tally: "_Tally | None" = None):
        """Run steps ``first..`` of ``epoch``: an :class:`EpochResult`, a Cursor to rewind to, or a :class:`_Replan`."""
        # Step outputs stay tensors until they are needed: reading one back every step would make
        # the host wait for each step before dispatching the next (a GPU would idle). Without a
        # guard or monitor they are read at the epoch's end; with one, each self._lag steps behind
        # (anomalies, timings; see LAG), and all of them before a checkpoint.
        tf = _tf()
        if tally is None:
            tally = _Tally(self._local, guard.partial(Cursor(epoch, first)) if guard is not None else None,
                           per_replica=self._workers == 1)
        pending: deque = deque()
        self.cursor = Cursor(epoch, first)
        k, step = self.accumulate_steps, first
        while step < plan.num_steps:
            # One update: the steps up to the next multiple of k (fewer at the epoch's end), so a
            # run resumed at a group boundary groups its steps as an uninterrupted one does.
            count = min(k - step % k, plan.num_steps - step)
            if on_batch is None:
                at = tf.constant(epoch * plan.num_steps + step, tf.int64) if self.timing else None
                outs = self._train_next(stream, count, at)
            else:
                batches = [next(stream) for _ in range(count)]
                outs = self._train_step(*batches)
            for i, out in enumerate(outs):
                pending.append((step + i, out))
                if on_batch is not None:
                    on_batch(Cursor(epoch, step + i + 1), batches[i])
            step += count
            self.cursor = Cursor(epoch, step)
            if on_step is not None:
                on_step(self.cursor, outs[0]["sums"] if count == 1 else sum(o["sums"] for o in outs))
            if guard is None and monitor is None:
                continue
            end = step == plan.num_steps
            due = end or (guard is not None and guard.due(self.cursor))
            self._settle(pending, tally, guard, epoch, keep=0 if due else self._lag, monitor=monitor)
            if monitor is not None:
                self._check_speeds(monitor, end)
            if guard is not None:
                rewind = guard.after_step(self, self.cursor, tally, self._result(epoch, tally) if end else None)
                if rewind is not None:
                    self._decided = None
                    if monitor is not None:
                        monitor.drop()
                    return rewind
            if self._decided is not None and not end:
                # Every worker decided the same at the same update (same gathered numbers).
                self._settle(pending, tally, guard, epoch, keep=0, monitor=monitor)
                self._check_speeds(monitor, True)  # logs the steps settled just now (in cool-down: no decision)
                return _Replan(self.cursor, tally)
        self._settle(pending, tally, guard, epoch, keep=0, monitor=monitor)
        if monitor is not None:
            self._check_speeds(monitor, True)
        return self._result(epoch, tally)

    def _check_speeds(self, monitor, end_of_epoch: bool) -> None:
        """Gather the monitor's window across workers when due; keep a decision with new weights."""
        if not monitor.due(end_of_epoch):
            return
        decision = monitor.absorb(self._all_workers(monitor.window()), end_of_epoch=end_of_epoch)
        if decision is not None and decision.weights is not None:
            self._decided = decision

    def _settle(self, pending: deque, tally: "_Tally", guard, epoch: int, keep: int, monitor=None) -> None:
        # Read back all but the last `keep` step outputs (waits for those steps to finish).
        wants_ids = (guard is not None and guard.needs_ids) or (monitor is not None and monitor.needs_ids)
        while len(pending) > keep:
            step, out = pending.popleft()
            row = {k: v.numpy() for k, v in out.items() if wants_ids or k in ("sums", "flags", "timing")}
            tally.add(row)
            if guard is not None:
                guard.record(epoch, step, row)
            if monitor is not None:
                monitor.record(epoch, step, row)

    def _result(self, epoch: int, tally: "_Tally") -> EpochResult:
        # Under several workers the per-replica sums are all-gathered, once per tally state: every
        # worker calls this at its epoch's end whether or not it also did for a guard.
        if tally.gathered is None or tally.gathered[0] != tally.steps:
            tally.gathered = (tally.steps, self._all_workers(tally.sums))
        sums = tally.gathered[1]
        totals = sums.sum(axis=0) + tally.base
        loss_sum, hits, n = totals
        n = int(round(n))
        return EpochResult(epoch=epoch, steps=tally.steps, samples=n, loss=float(loss_sum) / max(n, 1),
                           accuracy=float(hits) / max(n, 1), seconds=tally.seconds(),
                           replica_samples=tuple(int(round(c)) for c in sums[:, 2]),
                           skipped_steps=tally.skipped)

    def evaluate(self, reader, plan: Plan, epoch: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set).

        Every sample of the plan's index is counted exactly once. Each call reads one
        bounded pipeline to its end (~0.1-0.3 s of start-up on the 2-core machine).
        """
        stream = iter(reader.distribute(self.strategy, plan, start=Cursor(epoch, 0), epochs=1))
        totals = np.zeros((self._local, 3))
        for _ in range(plan.num_steps):
            totals += self._eval_next(stream).numpy()
        _drain(stream)
        totals = self._all_workers(totals).sum(axis=0)
        n = int(round(totals[2]))
        return EvalResult(count=n, loss=float(totals[0]) / max(n, 1), accuracy=float(totals[1]) / max(n, 1))


@dataclass(frozen=True)
class _Replan:
    """The epoch stops at ``cursor`` to continue under new weights, with its running ``tally``."""

    cursor: Cursor
    tally: "_Tally | None"


class _Tally:
    """Running totals of one epoch's applied steps; saved in checkpoints to finish the epoch's figures.

    ``sums`` is float64 ``[local replicas, 3]`` (loss sum, hits, real count) of this
    process; ``base`` holds totals carried over from a checkpoint. A checkpoint stores
    the sums of *all* replicas (``to_dict(all_sums)``); a single worker with the same
    replicas takes them back per replica, otherwise (other replicas, or several
    workers, each of which must not count them again) they become ``base``.
    """

    def __init__(self, replicas: int, partial: dict | None = None, per_replica: bool = True):
        self.sums = np.zeros((replicas, 3))
        self.base = np.zeros(3)
        self.gathered = None  # (steps, sums of all workers' replicas) once all-gathered
        self.steps = self.skipped = 0
        self._seconds = 0.0
        self._began = time.perf_counter()
        if partial:
            sums = np.asarray(partial["sums"], dtype=np.float64).reshape(-1, 3)
            if per_replica and sums.shape == self.sums.shape:
                self.sums += sums
            else:
                self.base += sums.sum(axis=0)
            self.base += np.asarray(partial.get("base", np.zeros(3)), dtype=np.float64)
            self.steps, self.skipped = int(partial["steps"]), int(partial["skipped"])
            self._seconds = float(partial["seconds"])

    def add(self, row: dict) -> None:
        self.steps += 1
        if row["flags"][:, 2].max() > 0:  # skipped: nothing was trained
            self.skipped += 1
        else:
            self.sums += row["sums"]

    def seconds(self) -> float:
        return self._seconds + time.perf_counter() - self._began

    def to_dict(self, all_sums: np.ndarray | None = None) -> dict:
        """JSON form; ``all_sums`` are the sums of every worker's replicas (default this worker's)."""
        sums = self.sums if all_sums is None else np.asarray(all_sums)
        return {"sums": sums.tolist(), "base": self.base.tolist(), "steps": self.steps,
                "skipped": self.skipped, "seconds": self.seconds()}


def _skip_optimizer_all_reduce(optimizer) -> None:
    """Make a Keras 3 optimizer apply the gradients it is given as they are.

    Keras's TensorFlow optimizer sums gradients over replicas itself
    (``TFOptimizer._all_reduce_sum_gradients``) when ``apply`` runs in replica
    context. A trainer that has already all-reduced them (compressed) must switch that
    off, or the sum would be taken twice; a ``LossScaleOptimizer`` delegates to its
    inner optimizer, so that is the one to change.
    """
    target = getattr(optimizer, "inner_optimizer", optimizer)
    if not callable(getattr(target, "_all_reduce_sum_gradients", None)):
        raise TypeError(f"gradient compression needs a Keras 3 TensorFlow optimizer (with "
                        f"_all_reduce_sum_gradients), got {type(target).__name__}; use compression='none'")
    target._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)


def _suspects(features, logits, per_sample):
    """bool ``[slots]``: samples whose input, logits or loss hold a non-finite value.

    The input is checked, not only the loss: a kernel may map a NaN input to a finite
    output (oneDNN's fused matmul + ReLU turns it into 0) while the gradient stays NaN, so
    the loss alone would name no sample on some CPUs and the right one on others.
    """
    tf = _tf()

    def row_finite(t):
        t = tf.convert_to_tensor(t)
        if not t.dtype.is_floating:
            return tf.ones(tf.shape(t)[:1], tf.bool)
        t = tf.cast(t, tf.float32)
        return tf.reduce_all(tf.reshape(tf.math.is_finite(t), [tf.shape(t)[0], -1]), axis=1)

    finite = tf.logical_and(row_finite(features), row_finite(logits))
    return tf.logical_not(tf.logical_and(finite, tf.math.is_finite(tf.cast(per_sample, tf.float32))))


def _all_finite(tensors):
    tf = _tf()
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None])


def _drain(stream) -> None:
    """Read a finished stream to its end before it is deleted.

    Deleting an iterator waits for its in-flight work with the GIL held; a source
    that runs Python in the pipeline (``tf.numpy_function``) could then deadlock.
    At the end of the stream nothing is in flight.
    """
    for _ in stream:
        raise RuntimeError("the input pipeline yielded more batches than the plan has steps; "
                           "please report this as a bug")


def _clock(anchor, since, factor, sample_seconds):
    """The host clock (``time.time()``, the clock of ``tf.timestamp``), after an emulated delay.

    The emulated device is busy ``factor * max(compute, sample_seconds)`` from ``since``, where
    ``compute = now - since`` is the real work done so far: the real computation runs inside the
    device time instead of before it. (Session 3 slept ``factor * sample_seconds`` after the
    computation; on 2 shared cores the replicas' real computations ran one after another, so the
    replica scheduled last started its sleep last, a queue that separate devices do not have.)
    With ``sample_seconds`` 0 the delay is ``(factor - 1) * compute``. ``anchor`` (a replica's
    resource handle) is only there to order the call (see ``Trainer._anchor``).
    """
    now = time.time()
    f = float(factor)
    compute = max(now - float(since), 0.0)
    delay = f * max(compute, float(sample_seconds)) - compute
    if delay > 0:
        time.sleep(delay)
        now = time.time()
    return np.float64(now)


def _now():
    """The host clock as a graph op. Not ``tf.timestamp``: op determinism (``--deterministic``) forbids it."""
    tf = _tf()
    return tf.ensure_shape(tf.py_function(wall_clock, [], tf.float64), [])



def _stack_padded(tensors):
    """Stack per-replica tensors; rank >= 1 ones of different lengths are padded (-1, or False) to the longest.

    With ``trim_padding`` readers, each replica's batch has its own length.
    """
    tf = _tf()
    tensors = list(tensors)
    if not tensors[0].shape.rank or len(tensors) == 1 or all(
            t.shape[0] is not None and t.shape[0] == tensors[0].shape[0] for t in tensors):
        return tf.stack(tensors)
    longest = tf.reduce_max(tf.stack([tf.shape(t)[0] for t in tensors]))
    out = []
    for t in tensors:
        pad = [[0, longest - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1)
        if t.dtype == tf.bool:
            out.append(tf.cast(tf.pad(tf.cast(t, tf.int8), pad), tf.bool))
        else:
            out.append(tf.pad(t, pad, constant_values=tf.cast(-1, t.dtype)))
    return tf.stack(out)
