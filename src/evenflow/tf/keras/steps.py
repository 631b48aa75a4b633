"""Exact ``model.fit`` and ``model.evaluate`` with the user's own compiled loss and metrics.

:func:`exact_steps` gives a compiled Keras model a ``train_step`` and a ``test_step`` for the
batches of :func:`~evenflow.tf.keras.data.keras_dataset`, whose elements are
``(features, label, meta)`` with ``meta`` holding each row's ``mask``, the step's
``global_real_count`` and the sample ``id``. With them, whatever the number of replicas and
however the plan pads a step:

* **the loss** the user compiled is computed with per-sample weights that make the replicas'
  losses add up to what a single device computes on the step's real samples: their mean for
  Keras's default ``reduction="sum_over_batch_size"`` (Keras divides each replica's weighted
  sum by its padded batch and by the number of replicas; the weights undo exactly that), their
  sum for ``"sum"``. So the update Keras's optimizer applies after its all-reduce SUM is the one
  a single device computes on those samples. Per-position losses (a tagger's ``[batch, time]``,
  a segmenter's ``[batch, height, width]``) get each sample's weight on all its positions.
  Regularization losses (``model.losses``) are added once, as Keras does;
* **the displayed ``loss``** (and ``val_loss``, and each output's ``<name>_loss``) is
  accumulated per replica from its real samples only and summed by Keras at the epoch's end:
  what a single device's ``fit`` shows;
* **the compiled metrics** (``metrics=`` and ``weighted_metrics=``) see the real rows only,
  each once;
* **per-sample weights** (``meta["weight"]``, from ``fit``'s ``class_weight`` or
  ``sample_weight``) multiply each real row's loss, as Keras weights a loss by
  ``sample_weight``, and weight the ``weighted_metrics``.

Batches that are not ``keras_dataset``'s (``model.evaluate(x_test, y_test)`` on arrays) take
Keras's own steps. The loss reduction is checked again each time a step is traced, so a model
compiled again keeps exact steps or is refused. What cannot be made exact is refused or warned
about by :mod:`evenflow.tf.keras.compiled`.

A step can also record what it did: each replica's sample ids, ``[loss sum, hits, real count]``
and clock stamps, reported to the host as it runs (:class:`~evenflow.tf.keras.recorder.StepRecorder`)
or kept in buffers on its device (:class:`~evenflow.tf.keras.step_buffer.StepBuffer`).
"""
from __future__ import annotations

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.keras.compiled import check_model, check_output_masks, loss_reduction
from evenflow.tf.keras.data import META_KEYS, WEIGHT
from evenflow.tf.keras.output_losses import exact_output_losses
from evenflow.tf.keras.recorder import StepRecorder
from evenflow.tf.strategy import local_replicas


def _is_meta(value) -> bool:
    return isinstance(value, dict) and set(value) - {WEIGHT} == set(META_KEYS)


def _check_own_row(meta):
    """The op that fails the step unless this replica got its own row of the plan (a plan of the strategy's replicas)."""
    tf = _tf()
    me = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
    return tf.debugging.assert_equal(meta["replica"], me, message=(
        "a replica got rows of another replica of the plan: the plan of keras_dataset must have as many replicas "
        "as the strategy; build it with evenflow.tf.topology_of(strategy)"))


def _per_position(weights, output):
    """The row weights shaped ``[rows, 1, ...]`` to weigh every position of an output's per-sample loss."""
    rank = output.shape.rank
    if rank is None or rank <= 2:
        return weights
    return _tf().reshape(weights, [-1] + [1] * (rank - 2))


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

    def __init__(self, model, recorder: StepRecorder | None):
        self.model, self.recorder = model, recorder
        self._keras = type(model)  # its train_step and test_step are Keras's own (check_model)

    def _loss(self, x, y, y_pred, meta, training: bool):
        """(loss to differentiate, this replica's sum of real-sample losses as shown, real count, mask)."""
        tf = _tf()
        model = self.model
        reduction = loss_reduction(model)  # at trace time: a model compiled again is checked again
        check_output_masks(y_pred, reduction)
        with tf.control_dependencies([_check_own_row(meta)]):  # before anything the update reads
            mask = tf.identity(tf.cast(meta["mask"], tf.float32))
        count = tf.maximum(tf.cast(meta["global_real_count"][0], tf.float32), 1.0)
        replicas = float(tf.distribute.get_strategy().num_replicas_in_sync)
        rows = tf.cast(tf.shape(mask)[0], tf.float32)
        mean = reduction != "sum"
        row_weights = mask * (rows * replicas / count) if mean else mask
        if WEIGHT in meta:
            row_weights = row_weights * tf.cast(meta[WEIGHT], tf.float32)
        weights = tf.nest.map_structure(lambda out: _per_position(row_weights, out), y_pred)
        real = tf.reduce_sum(mask)
        # Keras records each output's loss as R * s / count (mean) or R * s (sum), s the replica's
        # real-sample sum; the total below is shown as s + real * extra (mean), count * s + real * extra (sum).
        factor = count / (replicas * tf.maximum(real, 1.0))
        with exact_output_losses(model, factor, real):
            total = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights, training=training)
        extra = tf.add_n([tf.cast(v, total.dtype) for v in model.losses]) if model.losses else \
            tf.zeros([], total.dtype)
        data = total - extra / replicas  # this replica's sum of real-sample losses (/ count for a mean)
        # The epoch's displayed loss: per replica, (count * data + real * extra) over real, weighted by real.
        shown = (tf.cast(data, tf.float32) * count + real * tf.cast(extra, tf.float32)) / tf.maximum(real, 1.0)
        model._loss_tracker.update_state(shown, sample_weight=real)
        return total, shown * real, real, mask

    def _metrics(self, x, y, y_pred, mask, meta):
        keep = mask > 0
        weight = _real(meta[WEIGHT], keep) if WEIGHT in meta else None  # for the weighted_metrics
        return self.model.compute_metrics(x, _real(y, keep), _real(y_pred, keep), sample_weight=weight)

    def train_step(self, data):
        tf = _tf()
        if not (isinstance(data, tuple) and len(data) == 3 and _is_meta(data[2])):
            return self._keras.train_step(self.model, data)  # not keras_dataset's batches: Keras's own step
        x, y, meta = data
        model = self.model
        started = self.recorder.stamp([meta["mask"]]) if self.recorder is not None else None
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
        return _for_reduction(self._metrics(x, y, y_pred, mask, meta))

    def test_step(self, data):
        if not (isinstance(data, tuple) and len(data) == 3 and _is_meta(data[2])):
            return self._keras.test_step(self.model, data)
        x, y, meta = data
        y_pred = self.model(x, training=False)
        _, _, _, mask = self._loss(x, y, y_pred, meta, training=False)
        return _for_reduction(self._metrics(x, y, y_pred, mask, meta))

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras's symbolic build from one replica's first batch, under several workers.

        Keras 3 averages a first distributed batch across the replicas to learn its shapes, a
        reduction that ``MultiWorkerMirroredStrategy`` refuses for a nested batch; the shapes of
        this worker's first replica are the same (every replica's row has the plan's slots).
        """
        tf = _tf()
        strategy = self.model.distribute_strategy
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v, next(it))
                break
        with strategy.scope():
            self.model._symbolic_build(data_batch=data_batch)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        # Keras builds the compiled metrics from a first batch; an evenflow ``meta`` dict there is
        # not a sample weight (the steps above pass the real rows and no weights).
        if _is_meta(sample_weight):
            sample_weight = None
        return self._compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if _is_meta(sample_weight):  # Keras's symbolic build passes keras_dataset's meta as a weight
            mask = _tf().cast(sample_weight.get(WEIGHT, sample_weight["mask"]), "float32")
            sample_weight = _tf().nest.map_structure(lambda out: _per_position(mask, out), y_pred)
        return self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)


def _several_workers(strategy) -> bool:
    """True for a strategy whose replicas span several worker processes."""
    return strategy.num_replicas_in_sync > local_replicas(strategy)


def _for_reduction(logs):
    """The step's logs as Keras reduces them across replicas: scalars as ``[1]`` under several workers.

    Under ``MultiWorkerMirroredStrategy`` Keras reduces each value with ``strategy.reduce("MEAN", v, axis=0)``,
    which refuses a scalar (keras-team/keras#20585); a ``[1]`` value reduces to the scalar mean over the
    replicas, what Keras shows under ``MirroredStrategy``.
    """
    tf = _tf()
    if not _several_workers(tf.distribute.get_strategy()):
        return logs
    return tf.nest.map_structure(lambda v: tf.reshape(v, [1]) if tf.is_tensor(v) and v.shape.rank == 0 else v, logs)


def _after(grads, done):
    tf = _tf()
    with tf.control_dependencies([done]):
        return [None if g is None else tf.identity(g) for g in grads]


def exact_steps(model, recorder: StepRecorder | None = None):
    """Give a compiled model evenflow's exact ``train_step``/``test_step`` (see the module docstring).

    Call after ``model.compile`` and before ``fit``/``evaluate`` on
    :func:`~evenflow.tf.keras.data.keras_dataset` batches. Idempotent; returns the model.

    Raises:
        TypeError: ``model`` is not a Keras model, or ``recorder`` not a :class:`StepRecorder`.
        ValueError: the model is not compiled, its loss reduction cannot be made exact, or it
            overrides ``train_step``, ``test_step`` or ``compute_loss`` itself (use
            :func:`~evenflow.tf.masked_loss` in your own step instead).
    """
    check_model(model)
    if recorder is not None and not isinstance(recorder, StepRecorder):
        raise TypeError(f"recorder must be an evenflow.tf.StepRecorder or None, got {type(recorder).__name__}")
    loss_reduction(model)
    current = getattr(model, "_evenflow_exact", None)
    if current is None:
        current = _Exact(model, recorder)
        current._compute_metrics, current._compute_loss = model.compute_metrics, model.compute_loss
        object.__setattr__(model, "_evenflow_exact", current)
    changed = current.recorder is not recorder or getattr(model, "train_step", None) != current.train_step
    current.recorder = recorder
    for name in ("train_step", "test_step", "compute_metrics", "compute_loss"):
        object.__setattr__(model, name, getattr(current, name))
    if _several_workers(model.distribute_strategy):
        object.__setattr__(model, "_maybe_symbolic_build", current.maybe_symbolic_build)
    if changed:  # functions traced before would keep the previous steps
        for name in ("train_function", "test_function"):
            object.__setattr__(model, name, None)
    return model
