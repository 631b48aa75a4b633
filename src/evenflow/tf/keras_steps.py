"""Exact ``model.fit`` and ``model.evaluate`` with the user's own compiled loss and metrics.

:func:`exact_steps` gives a compiled Keras model a ``train_step`` and a ``test_step`` for the
batches of :func:`~evenflow.tf.keras_data.keras_dataset`, whose elements are
``(features, label, meta)`` with ``meta`` holding each row's ``mask``, the step's
``global_real_count`` and the sample ``id``. With them, whatever the number of replicas and
however the plan pads a step:

* **the loss** the user compiled (default ``reduction="sum_over_batch_size"``, or ``"sum"``)
  is computed with per-sample weights that make the replicas' losses add up to the mean over
  the step's real samples (Keras divides each replica's weighted sum by its padded batch and
  by the number of replicas; the weights undo exactly that), so the update Keras's optimizer
  applies after its all-reduce SUM is the one a single device computes on those samples;
  regularization losses (``model.losses``) are added once, as Keras does;
* **the displayed ``loss``** (and ``val_loss``) is a sum over real samples divided by their
  number, accumulated per replica and summed by Keras at the epoch's end: the epoch's mean
  over its samples, which is what a single device's ``fit`` shows;
* **the compiled metrics** (``metrics=`` and ``weighted_metrics=``) see the real rows only,
  each once.

A step can also report what it did to the host (:class:`StepRecorder`): each replica's
sample ids, ``[loss sum, hits, real count]`` and host-clock stamps — what the audit,
checkpoints, telemetry and re-plans of :mod:`evenflow.tf.keras_run` read.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.pyfunc import wall_clock

__all__ = ["exact_steps", "loss_reduction", "recorder_of", "StepRecorder", "REDUCTIONS"]

# Reductions whose per-replica scaling the weights can undo exactly ("mean" is Keras's alias).
REDUCTIONS = ("sum_over_batch_size", "mean", "sum")


def _reduction_of(loss) -> str:
    if loss is None or isinstance(loss, str) or (callable(loss) and not hasattr(loss, "reduction")):
        return "sum_over_batch_size"  # Keras wraps names and plain functions with its default reduction
    return str(getattr(loss, "reduction", "sum_over_batch_size"))


def loss_reduction(model) -> str:
    """The one reduction of the model's compiled loss(es); refuses one evenflow cannot make exact."""
    loss = getattr(model, "loss", None)
    if loss is None:
        raise ValueError("the model has no compiled loss: call model.compile(optimizer=..., loss=...) first")
    losses = list(loss.values()) if isinstance(loss, dict) else list(loss) if isinstance(loss, (list, tuple)) \
        else [loss]
    found = {_reduction_of(item) for item in losses if item is not None}
    found = {"sum_over_batch_size" if r == "mean" else r for r in found}
    bad = sorted(found - set(REDUCTIONS))
    if bad or len(found) > 1:
        raise ValueError(f"the compiled loss reduction must be one of {', '.join(REDUCTIONS)} (the same for every "
                         f"output), got {', '.join(sorted(found))}; compile the loss with Keras's default reduction")
    return found.pop() if found else "sum_over_batch_size"


class StepRecorder:
    """Collects, from inside the traced steps, what each replica trained on (host side).

    Each record is ``(replica, ids [slots] int64, sums [3] float64, stamps [2] float64)``:
    ``sums`` is ``[loss sum over real samples, hits, real count]`` (the loss as Keras shows
    it, regularization included) and ``stamps`` the host clock when the replica's inputs were
    there and when its gradients were.

    Args:
        simulate: an :class:`~evenflow.run.simulate.Simulation` to emulate slow replicas (their
            gradients are held back, as :class:`~evenflow.tf.trainer.Trainer` does), or None.
            Steps count from the recorder's creation.
    """

    def __init__(self, simulate=None):
        self._lock = threading.Lock()
        self._records: list[tuple] = []
        self.simulate = simulate if simulate is not None and simulate.active else None
        self._steps: dict[int, int] = {}

    def _record(self, replica, ids, sums, started):
        replica, sums, started = int(replica), np.asarray(sums, np.float64), float(started)
        done = time.time()
        if self.simulate is not None:
            done = self._emulate(replica, started, done, float(sums[2]))
        with self._lock:
            self._records.append((replica, np.asarray(ids, np.int64), sums, np.array([started, done])))
        return np.float64(done)

    def _emulate(self, replica: int, started: float, now: float, real: float) -> float:
        """Hold the replica until its emulated device is done (see :mod:`evenflow.run.simulate`)."""
        with self._lock:
            step = self._steps.get(replica, 0)
            self._steps[replica] = step + 1
        factor = 1.0
        for slow in self.simulate.slow:
            if slow.replica == replica and step >= slow.from_step:
                factor *= slow.factor
        compute = max(now - started, 0.0)
        delay = factor * max(compute, self.simulate.sample_ms / 1000.0 * real) - compute
        if delay > 0:
            time.sleep(delay)
            now = time.time()
        return now

    def drain(self) -> list[tuple]:
        """The records since the last call, in the order the replicas finished them."""
        with self._lock:
            out, self._records = self._records, []
        return out

    def record(self, ids, sums, started, after):
        """Graph op: record one replica's step once ``after`` (its gradients) are computed."""
        tf = _tf()
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.control_dependencies([a for a in after if a is not None]):
            return tf.py_function(self._record, [replica, ids, tf.cast(sums, tf.float64), started], tf.float64)


def _stamp(after):
    tf = _tf()
    with tf.control_dependencies(after):
        return tf.ensure_shape(tf.py_function(wall_clock, [], tf.float64), [])


def _real(structure, keep):
    tf = _tf()
    return tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), structure)


def _hits(y, y_pred, mask):
    """Correct top-1 predictions among real rows for sparse class labels, else 0."""
    tf = _tf()
    if not (tf.is_tensor(y) and tf.is_tensor(y_pred)) or y_pred.shape.rank != 2 or y.shape.rank not in (1, 2):
        return tf.constant(0.0)
    labels = tf.reshape(tf.cast(y, tf.int64), [-1])
    if y.shape.rank == 2 and y.shape[-1] != 1:
        labels = tf.argmax(y, axis=-1)
    right = tf.cast(tf.equal(tf.argmax(y_pred, axis=-1), labels), tf.float32)
    return tf.reduce_sum(right * mask)


class _Exact:
    """The replacement steps, bound to one model; see the module docstring."""

    def __init__(self, model, reduction: str, recorder: StepRecorder | None):
        self.model, self.reduction, self.recorder = model, reduction, recorder

    def _loss(self, x, y, y_pred, meta, training: bool):
        """(loss to differentiate, this replica's sum of real-sample losses, real count, step count)."""
        tf = _tf()
        model = self.model
        mask = tf.cast(meta["mask"], tf.float32)
        count = tf.maximum(tf.cast(meta["global_real_count"][0], tf.float32), 1.0)
        replicas = float(tf.distribute.get_strategy().num_replicas_in_sync)
        rows = tf.cast(tf.shape(mask)[0], tf.float32)
        weights = mask * (rows * replicas / count) if self.reduction != "sum" else mask / count
        total = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights, training=training)
        extra = tf.add_n([tf.cast(v, total.dtype) for v in model.losses]) if model.losses else \
            tf.zeros([], total.dtype)
        data = total - extra / replicas  # this replica's sum of real-sample losses / count
        real = tf.reduce_sum(mask)
        # The epoch's displayed loss: per replica, (sum of real-sample losses + real * extra) over real.
        shown = (tf.cast(data, tf.float32) * count + real * tf.cast(extra, tf.float32)) / tf.maximum(real, 1.0)
        model._loss_tracker.update_state(shown, sample_weight=real)
        return total, shown * real, real, mask

    def _metrics(self, x, y, y_pred, mask):
        keep = mask > 0
        return self.model.compute_metrics(x, _real(y, keep), _real(y_pred, keep), sample_weight=None)

    def train_step(self, data):
        tf = _tf()
        x, y, meta = data
        model = self.model
        started = _stamp([meta["mask"]]) if self.recorder is not None else None
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            total, loss_sum, real, mask = self._loss(x, y, y_pred, meta, training=True)
            scaled = model.optimizer.scale_loss(total)
        variables = model.trainable_variables
        grads = tape.gradient(scaled, variables)
        if self.recorder is not None:
            sums = tf.stack([loss_sum, _hits(y, y_pred, mask), real])
            done = self.recorder.record(meta["id"], sums, started, list(grads))
            grads = _after(grads, done)
        model.optimizer.apply_gradients(zip(grads, variables))
        return self._metrics(x, y, y_pred, mask)

    def test_step(self, data):
        x, y, meta = data
        y_pred = self.model(x, training=False)
        _, _, _, mask = self._loss(x, y, y_pred, meta, training=False)
        return self._metrics(x, y, y_pred, mask)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        # Keras builds the compiled metrics from a first batch; an evenflow ``meta`` dict there is
        # not a sample weight (the steps above pass the real rows and no weights).
        if isinstance(sample_weight, dict):
            sample_weight = None
        return self._compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if isinstance(sample_weight, dict):
            sample_weight = sample_weight["mask"]
        return self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)


def _after(grads, done):
    tf = _tf()
    with tf.control_dependencies([done]):
        return [None if g is None else tf.identity(g) for g in grads]


def recorder_of(model, simulate=None) -> StepRecorder:
    """The recorder the model's exact steps write to, if it emulates ``simulate``; else a new one.

    Reusing it keeps Keras's traced step functions (a new recorder means tracing them again).
    """
    current = getattr(model, "_evenflow_exact", None)
    recorder = current.recorder if current is not None else None
    wanted = simulate if simulate is not None and simulate.active else None
    if recorder is None or recorder.simulate != wanted:
        return StepRecorder(simulate)
    recorder.drain()
    return recorder


def exact_steps(model, recorder: StepRecorder | None = None):
    """Give a compiled model evenflow's exact ``train_step``/``test_step`` (see the module docstring).

    Call after ``model.compile`` and before ``fit``/``evaluate`` on
    :func:`~evenflow.tf.keras_data.keras_dataset` batches. Idempotent; returns the model.

    Raises:
        ValueError: the model is not compiled, its loss reduction cannot be made exact, or it
            overrides ``train_step``/``test_step`` itself (use :func:`~evenflow.tf.masked_loss`
            in your own step instead).
    """
    if not getattr(model, "compiled", False):
        raise ValueError("compile the model before evenflow.tf.exact_steps(model): "
                         "model.compile(optimizer=..., loss=..., metrics=[...])")
    reduction = loss_reduction(model)
    current = getattr(model, "_evenflow_exact", None)
    if current is None:
        keras_model = _keras_model_class()
        for name in ("train_step", "test_step"):
            if getattr(type(model), name) is not getattr(keras_model, name):
                raise ValueError(f"{type(model).__name__} overrides {name}; evenflow's exact {name} would replace "
                                 f"it: in your own step, use evenflow.tf.masked_loss(per_sample_loss, mask, "
                                 f"global_real_count) on the batch's meta instead")
        current = _Exact(model, reduction, recorder)
        current._compute_metrics, current._compute_loss = model.compute_metrics, model.compute_loss
        object.__setattr__(model, "_evenflow_exact", current)
    changed = current.reduction != reduction or current.recorder is not recorder or \
        getattr(model, "train_step", None) != current.train_step
    current.reduction, current.recorder = reduction, recorder
    for name in ("train_step", "test_step", "compute_metrics", "compute_loss"):
        object.__setattr__(model, name, getattr(current, name))
    if changed:  # functions traced before would keep the previous steps
        for name in ("train_function", "test_function"):
            object.__setattr__(model, name, None)
    return model


def _keras_model_class():
    from evenflow.tf._lazy import keras as _keras
    return _keras().Model

