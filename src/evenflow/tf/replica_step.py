"""What one replica computes in a step: the masked loss, gradients, the agreed skip, the outputs the host reads.

:class:`ReplicaStep` holds the model, the optimizer and the per-step options and is run by
``strategy.run`` inside the engine's traced functions (:mod:`evenflow.tf.engine`):

* each replica's loss is :func:`~evenflow.tf.losses.masked_loss`, its masked sum divided by
  the step's global real count; Keras 3's optimizer, called in replica context, all-reduces
  the gradients with ``ReduceOp.SUM`` before applying them, so the update is the gradient of
  the mean over the step's real samples, for any number of replicas;
* ``accumulate_steps=k``: one update from k plan steps, each micro-step's masked sum divided
  by the real count of all k together (the gradient of the mean over their union);
* ``compression="fp16"``: gradients travel in float16 in an all-reduce of its own (the
  optimizer's is switched off);
* a step whose loss or gradients are non-finite on any replica is skipped everywhere
  (``skip_nonfinite``). Under MirroredStrategy with gradients neither compressed nor
  loss-scaled (the optimizer's update runs in cross-replica context) the verdict is taken
  there once a step, from every replica's loss and the summed gradients (a NaN or Inf on any
  replica makes the sum non-finite, and so does a sum beyond the float range); elsewhere two
  flags summed over replicas make every replica take the same branch, in the gradients' own
  all-reduce where the gradients are neither compressed nor loss-scaled (one collective a step);
* with ``timing``, host-clock stamps of when each replica started and had its gradients,
  and the emulated slowdown of :mod:`evenflow.run.simulate`.

The outputs per plan step are ``sums_flags`` ``[loss sum, hits, real count, this replica
non-finite, step anomalous, update skipped]`` (one tensor, split by the engine into ``sums``
and ``flags``), ``ids``, ``nonfinite`` (suspect samples), ``replica`` (global id) and, on an
update's last step, ``timing``: what :mod:`evenflow.run.loop` reads back. Without ids (no
guard names replicas) the "this replica" flag holds the step's verdict instead.
"""
from __future__ import annotations

import contextlib

import numpy as np

from evenflow.run.step_options import StepOptions
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.losses import masked_sum
from evenflow.tf.optimizers import presum_gradients
from evenflow.tf.clock import emulated_clock


class ReplicaStep:
    """The per-replica computations of training and evaluation (run under ``strategy.run``).

    Args:
        strategy: the ``tf.distribute`` strategy (for the clock anchor and the optimizer build).
        model: a built ``keras.Model`` mapping features to logits.
        optimizer: a Keras 3 optimizer (a ``LossScaleOptimizer`` under ``mixed_float16``).
        loss_fn: ``fn(labels, logits) -> [slots]`` per-sample loss.
        options: :class:`~evenflow.run.step_options.StepOptions`: ``anomaly.skip_nonfinite`` (skip the
            update of a step that is non-finite on any replica), ``compute.gradient_compression``,
            ``timing`` (stamp each replica's start and gradients, for the monitor) and ``simulate``
            (an active :class:`~evenflow.run.simulate.Simulation`, or None).
    """

    def __init__(self, strategy, model, optimizer, loss_fn, options: StepOptions):
        tf = _tf()
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.skip_nonfinite, self.compression = options.anomaly.skip_nonfinite, options.compute.gradient_compression
        self.timing, self.simulate = bool(options.timing), options.simulate
        self._loss_scaled = isinstance(optimizer, _keras().optimizers.LossScaleOptimizer)
        presum_gradients(optimizer, self.compression != "none")
        # Sum the gradients here, with the step's flags in the same all-reduce (see _apply), where
        # the optimizer would sum them itself (uncompressed, not loss-scaled, a Keras TF optimizer).
        self._fuse = self.compression == "none" and not self._loss_scaled and callable(
            getattr(optimizer, "_all_reduce_sum_gradients", None))
        with strategy.scope():
            # Where the update runs in cross-replica context anyway (the optimizer merges), the step
            # is judged there once, not by every replica (see _apply_once).
            self._once = self._fuse and not tf.__internal__.distribute.strategy_supports_no_merge_call()
            # Create the slot variables now, in cross-replica context, not lazily inside strategy.run.
            optimizer.build(model.trainable_variables)
            # Per-replica clock anchor: timing callbacks take its local handle as a resource input, which
            # keeps TensorFlow's automatic control dependencies from chaining every replica's callbacks
            # into one sequence (stateful ops without a resource input run in program order, which would
            # time replica 1 only after replica 0 finished and make emulated delays add up, not overlap).
            self._anchor = tf.Variable(0.0, trainable=False, name="evenflow_clock") if self.timing else None

    def train(self, *batches, clock=None, step=None, with_ids=True):
        """One update from the plan steps ``batches``; returns one output dict per step.

        With timing, ``clock`` is ``[step began, input ready]`` and ``step`` the run's global plan step.
        Without ``with_ids`` (nobody reads them: no guard, no monitor of costs) a step outputs no
        ``ids``, ``nonfinite`` or ``replica``, and computes no suspects.
        """
        tf = _tf()
        t_start = self._stamp([b["mask"] for b in batches]) if self.timing else None
        grads, loss, seen = self._gradients(batches)
        t_done = None
        if self.timing:
            # Gradients ready, plus the emulated device's delay if simulating (one callback for both).
            t_done = self._stamp([g for g in grads if g is not None] + [loss], since=t_start,
                                 **self._slowdown(batches, step))
            if self.simulate is not None:
                with tf.control_dependencies([t_done]):  # the update waits for the emulated device
                    grads = [None if g is None else tf.identity(g) for g in grads]
        flags = self._apply(loss, grads, with_ids)
        outs = [self._outputs(*s, flags, with_ids=with_ids) for s in seen]
        if self.timing:
            # [step began, input ready, replica started, gradients ready] (host clock, seconds); the
            # step's end is stamped after all replicas (see the engine).
            outs[-1]["timing"] = tf.concat([tf.cast(clock, tf.float64), tf.stack([t_start, t_done])], 0)
        return tuple(outs)

    def _gradients(self, batches):
        # Every step's masked sum is divided by the real count of all of them, so the summed
        # gradient is that of the mean over their union.
        tf = _tf()
        variables = self.model.trainable_variables
        count = batches[0]["global_real_count"] if len(batches) == 1 else \
            tf.add_n([tf.cast(b["global_real_count"], tf.float32) for b in batches])
        grads, loss, seen = None, None, []
        for batch in batches:
            with tf.GradientTape() as tape:
                logits = _logits(self.model(batch["features"], training=True))
                per_sample = self.loss_fn(batch["label"], logits)
                loss_sum = masked_sum(per_sample, batch["mask"])
                step_loss = loss_sum / tf.maximum(tf.cast(count, tf.float32), 1.0)  # masked_loss, sum shared
                scaled = self.optimizer.scale_loss(step_loss) if self._loss_scaled else step_loss
            step_grads = tape.gradient(scaled, variables)  # None for a variable the loss does not use
            grads = step_grads if grads is None else \
                [b if a is None else a if b is None else a + b for a, b in zip(grads, step_grads)]
            loss = step_loss if loss is None else loss + step_loss
            seen.append((batch, logits, per_sample, loss_sum))
        return grads, loss, seen

    def _apply(self, loss, grads, with_ids=True):
        """Apply (or skip, agreed by every replica) the update; returns the step's flags, three float32 scalars."""
        if self._once:
            return self._apply_once(loss, grads, with_ids)
        # Summing the flags makes every replica (and worker) see the same verdicts, so all of them take
        # the same branch below: a step skipped on one replica and applied on another would
        # desynchronise the weights, or hang a collective inside the update. (ReduceOp has only SUM
        # and MEAN: count the replicas whose loss, resp. gradients, are non-finite.)
        tf = _tf()
        variables = self.model.trainable_variables
        local_bad = tf.stack([1.0 - tf.cast(tf.math.is_finite(loss), tf.float32),
                              1.0 - tf.cast(_all_finite(grads), tf.float32)])
        if self._fuse:
            # The flags travel in the gradients' own all-reduce (one collective a step, not two); the
            # optimizer then gets the sums and must not take them again (see _presummed).
            grads, bad_replicas = _sum_with(grads, local_bad)
        else:
            bad_replicas = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local_bad)
        loss_bad, grads_bad = bad_replicas[0] > 0, bad_replicas[1] > 0
        if self.compression == "fp16":
            # On every replica, before the branches below: a collective inside one would hang. The
            # sums are the same on every replica, so a float16 overflow in them is an agreed verdict.
            grads = self._all_reduce_fp16(grads)
            grads_bad = tf.logical_or(grads_bad, tf.logical_not(_all_finite(grads)))
        with _presummed(self.optimizer, self._fuse):
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
        # flags: this replica non-finite, step anomalous on some replica, update skipped everywhere
        return tf.reduce_max(local_bad), tf.cast(anomaly, tf.float32), tf.cast(skipped, tf.float32)

    def _apply_once(self, loss, grads, with_ids):
        """:meth:`_apply` under a strategy that merges (MirroredStrategy): the verdict taken once a step.

        The gradients are summed in one all-reduce; in cross-replica context the step is judged
        once, from every replica's loss and the summed gradients (a NaN or Inf on any replica makes
        the sum non-finite), not once per replica, and the update is applied or skipped for all.
        """
        tf = _tf()
        ctx = tf.distribute.get_replica_context()
        # This replica's own verdict only where someone names replicas (a guarded run reads ids).
        local = 1.0 - tf.cast(_all_finite([loss] + grads), tf.float32) if with_ids else None
        real = [i for i, g in enumerate(grads) if g is not None]  # None: a variable the loss does not use
        summed = list(grads)
        for i, g in zip(real, ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in real])):
            summed[i] = g
        with _presummed(self.optimizer, True):
            anomaly, skipped = ctx.merge_call(self._judge_and_apply, args=(loss, summed))
        return (anomaly if local is None else local), anomaly, skipped

    def _judge_and_apply(self, distribution, losses, grads):
        # Cross-replica context: every replica's loss, and the summed gradients (the same on all:
        # replica 0's copy is judged). Returns (anomalous, skipped) as float32 scalars.
        tf = _tf()
        first = [None if g is None else distribution.experimental_local_results(g)[0] for g in grads]
        losses = tf.stack(distribution.experimental_local_results(losses))
        bad = tf.logical_not(tf.logical_and(tf.reduce_all(tf.math.is_finite(losses)), _all_finite(first)))

        def apply():
            distribution.extended.call_for_each_replica(
                lambda g: self.optimizer.apply(g, self.model.trainable_variables), args=(grads,))
            return tf.constant(True)

        if not self.skip_nonfinite:
            apply()
            return tf.cast(bad, tf.float32), tf.constant(0.0)
        tf.cond(bad, lambda: tf.constant(False), apply)
        bad = tf.cast(bad, tf.float32)
        return bad, bad

    def _stamp(self, after, since=None, factor=None, sample_seconds=None):
        """The host clock (seconds, float64) once ``after`` are computed.

        With ``since`` (this replica's start) and a slowdown, first sleeps until
        ``since + factor * max(now - since, sample_seconds)``: the emulated device (see
        :func:`~evenflow.tf.clock.emulated_clock`).
        """
        tf = _tf()
        zero, one = tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64)
        args = [self._anchor.handle, zero if since is None else since, one if factor is None else factor,
                zero if sample_seconds is None else sample_seconds]
        with tf.control_dependencies(after):
            return tf.ensure_shape(tf.py_function(emulated_clock, args, tf.float64), [])

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
        real = {i: tf.convert_to_tensor(g) for i, g in enumerate(grads) if g is not None}  # None: an unused variable
        summed = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.cast(g, tf.float16) for g in real.values()])
        back = dict(zip(real, summed))
        return [tf.cast(back[i], g.dtype) if i in back else None for i, g in enumerate(grads)]

    @staticmethod
    def _agree_on_finite(grads, any_bad):
        # LossScaleOptimizer decides "skip this step" from replica 0's *local* gradients; a float16
        # overflow on another replica alone would then be summed into the weights. Make the local
        # verdicts agree first: if any replica overflowed, every replica presents non-finite grads.
        tf = _tf()
        return [g if g is None else tf.where(any_bad, tf.constant(np.nan, g.dtype), g) for g in grads]

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

    def _outputs(self, batch, logits, per_sample, loss_sum, flags, with_ids=True) -> dict:
        # What the host learns about a step: its sums and flags in one vector (one output to gather,
        # split on the host), and for audits and anomaly reports the ids the replica actually
        # received, its slots with a non-finite loss and its global replica id.
        tf = _tf()
        row = tf.stack([loss_sum, _hits(batch["label"], logits, batch["mask"] > 0), tf.reduce_sum(batch["mask"]),
                        *flags])
        if not with_ids:
            return {"sums_flags": row}
        ctx = tf.distribute.get_replica_context()
        return {"sums_flags": row, "ids": batch["id"],
                "nonfinite": tf.logical_and(batch["mask"] > 0, _suspects(batch["features"], logits, per_sample)),
                "replica": tf.cast(ctx.replica_id_in_sync_group, tf.int64)}

    @staticmethod
    def _sums(batch, logits, per_sample):
        return masked_sums(batch["mask"], batch["label"], logits, per_sample)

    def evaluate(self, batch):
        logits = _logits(self.model(batch["features"], training=False))
        return self._sums(batch, logits, self.loss_fn(batch["label"], logits))


def _logits(out):
    """The model's output, refused when traced unless it is one tensor of logits ``[slots, classes]``."""
    tf = _tf()
    if not tf.is_tensor(out) or out.shape.rank != 2:
        what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (list, tuple, dict)) else \
            f"shape {getattr(out, 'shape', None)}"
        raise ValueError(f"the trainer's model must return one tensor of logits [slots, classes], got {what}; for "
                         f"a model of several outputs use evenflow.tf.fit (or model.fit with "
                         f"evenflow.tf.exact_steps), or a model that returns one tensor")
    return out


def masked_sums(mask, labels, logits, per_sample):
    """Unnormalised sums ``[loss, hits, real count]`` over a batch's real slots, in one vector:
    summed over replicas and steps on the host they give exact epoch totals without the host
    knowing each step's count."""
    tf = _tf()
    return tf.stack([masked_sum(per_sample, mask), _hits(labels, logits, mask > 0), tf.reduce_sum(mask)])


def _hits(labels, logits, real):
    """Real slots whose top logit is the label: counted for integer class ids ``[slots]`` and logits
    ``[slots, classes >= 2]`` only; anything else (float targets, one-hot rows, one logit) counts 0."""
    tf = _tf()
    labels = tf.convert_to_tensor(labels)
    ids = (labels.dtype.is_integer or labels.dtype.is_bool) and labels.shape.rank == 1
    if not (ids and logits.shape.rank == 2 and (logits.shape[-1] is None or logits.shape[-1] >= 2)):
        return tf.constant(0.0)
    right = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int64), tf.cast(labels, tf.int64))
    return tf.reduce_sum(tf.cast(tf.logical_and(right, real), tf.float32))


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


def _sum_with(grads, flags):
    """``(grads summed over replicas, flags summed)`` from one all-reduce (``None`` gradients stay None)."""
    tf = _tf()
    real = [i for i, g in enumerate(grads) if g is not None]  # None: a variable the loss does not use
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                            [grads[i] for i in real] + [flags])
    out = list(grads)
    for i, g in zip(real, summed[:-1]):
        out[i] = g
    return out, summed[-1]


@contextlib.contextmanager
def _presummed(optimizer, on: bool):
    """While the update is traced, the Keras optimizer takes the gradients as summed already.

    Keras's optimizer sums gradients over replicas in ``apply`` (``_all_reduce_sum_gradients``,
    called when the step is traced); :func:`_sum_with` did that already. Only the trace is
    changed: the optimizer is as it was afterwards (a user may go on with it in ``model.fit``).
    """
    if not on:
        yield
        return
    own = optimizer.__dict__.get("_all_reduce_sum_gradients")
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    try:
        yield
    finally:
        if own is None:
            del optimizer._all_reduce_sum_gradients  # the class's own method again
        else:
            optimizer._all_reduce_sum_gradients = own


def _all_finite(tensors):
    tf = _tf()
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None])
