"""``evenflow.tf.fit(model, x, y, ...)``: Keras's ``model.fit`` on an evenflow plan, exact on any number of replicas.

A program that calls ``model.fit(x, y, batch_size=64, epochs=5, validation_split=0.1)`` under a
``MirroredStrategy`` calls ``evenflow.tf.fit(model, x, y, batch_size=64, epochs=5,
validation_split=0.1)`` instead, with its model, its compiled loss and metrics and its
callbacks unchanged. evenflow then

* plans every epoch (each sample once, a fair share per replica, seeded shuffling, optional
  stratification or cost balance) and feeds Keras whole global steps (:func:`keras_dataset`);
* makes the compiled loss and metrics exact (:func:`~evenflow.tf.keras.steps.exact_steps`):
  every update, ``loss``, ``val_loss`` and metric is what one device computes on the same samples;
* with ``output_dir``: holds the directory (one run at a time), writes checkpoints every
  ``checkpoint_every`` steps and at each epoch's end, the audit trail with ``audit=True``
  (``evenflow audit OUTPUT_DIR``), ``telemetry.jsonl``, and resumes exactly from the newest
  checkpoint when called again — mid-epoch too: the rest of that epoch runs as a ``fit`` call of
  its own, then the remaining epochs; the progress and the returned ``History`` count the whole
  run's epochs (:mod:`evenflow.tf.keras.history`);
* takes ``class_weight`` and ``sample_weight`` exactly (:mod:`evenflow.tf.keras.weights`), and
  a :class:`~evenflow.tf.RecordChain` (your functions on TFRecord files) as ``x``;
* with ``rebalance=True``: measures each replica's step time and moves samples away from a slow
  one at the next epoch (``fit`` is called again on the new plan).

Under ``MultiWorkerMirroredStrategy`` (``evenflow launch --workers N -- python train.py``) every
worker calls ``fit`` alike: each reads only its replicas' rows of the plan
(:func:`~evenflow.tf.keras.data.keras_worker_dataset`), the steps hand Keras logs it can reduce
across workers (keras-team/keras#20585), and the run directory is shared as under ``evenflow
train`` (:mod:`evenflow.tf.keras.workers`): every worker writes its audit segments and its part of
each checkpoint, the chief ``history.json``. ``rebalance`` and ``simulate`` run on one worker only,
and several workers write no ``telemetry.jsonl``.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from evenflow.data.identity import digest
from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.plan.speed.rebalancer import RebalanceOptions
from evenflow.plan.topology import Topology
from evenflow.run.audit_ids import save_id_map, source_id_map
from evenflow.run.guard import TrainingGuard
from evenflow.run.lock import RunDirectory
from evenflow.run.options import CheckpointOptions
from evenflow.run.resume import ResumeWords, check_epochs_trained, check_same_run, resumable
from evenflow.run.training import plan_monitor
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.device_iterators import install as autotune_off_on_devices
from evenflow.tf.keras.compiled import check_compiled
from evenflow.tf.keras.data import keras_dataset, keras_worker_dataset
from evenflow.tf.keras.workers import FitWorkers, check_workers
from evenflow.run.checkpoint_trust import agreement
from evenflow.tf.keras.history import EpochLogs, progress_bar
from evenflow.tf.keras.inputs import ArrayPair, as_callbacks, as_source, check_stratify, split_validation
from evenflow.tf.keras.run import PlanCallback
from evenflow.tf.keras.recorder import recorder_of
from evenflow.tf.keras.step_buffer import buffer_of
from evenflow.tf.keras.steps import exact_steps
from evenflow.tf.keras.weights import given_weights, sample_weights
from evenflow.tf.input.reader import PlanReader
from evenflow.tf.input.source_adapter import reader_source
from evenflow.tf.state import TFState


# How a refused resume names fit's arguments (evenflow.run.resume.check_same_run).
KERAS_FIT = ResumeWords("output_dir", "this call", "", "the data, batch_size, seed, stratify", "epochs=",
                        "delete its checkpoints to start over")


def fit(model, x=None, y=None, *, batch_size: int = 32, epochs: int = 1, verbose="auto", callbacks=None,
        validation_split: float = 0.0, validation_data=None, shuffle: bool = True, seed: int = 0, output_dir=None,
        stratify: bool = False, balance: str = "count", checkpoint_every: int = CheckpointOptions.checkpoint_every,
        keep_checkpoints: int = CheckpointOptions.keep_checkpoints, audit: bool = CheckpointOptions.audit,
        rebalance=False, simulate=None, class_weight=None, sample_weight=None, validation_freq=1, initial_epoch=0,
        steps_per_epoch=None):
    """Train a compiled Keras model on an evenflow plan (see the module docstring).

    Args:
        model: a Keras model compiled under a ``tf.distribute`` strategy's scope (or none: one replica).
        x, y: arrays (or dicts/lists of arrays) as for ``model.fit``; or an evenflow source as
            ``x`` (:class:`evenflow.data.Source` or :class:`evenflow.tf.TensorSource`) and ``y`` None.
        batch_size: the global batch size G (summed over replicas, as in ``model.fit``).
        epochs: train up to the end of this epoch (a resumed run counts the epochs done).
        verbose, callbacks: passed to ``model.fit``.
        validation_split, validation_data: as for ``model.fit``, or an evenflow source; each sample once.
        shuffle, seed: shuffle must be True: plans shuffle every epoch, seeded by ``seed``.
        stratify: keep each step's label mix close to the dataset's (needs integer labels).
        balance: ``"count"`` or ``"cost"`` (needs a source with costs).
        output_dir: run directory for checkpoints, the audit trail and ``telemetry.jsonl``; a
            second call with the same arguments resumes from its newest checkpoint.
        checkpoint_every, keep_checkpoints, audit: also checkpoint every this many steps of an epoch (0: epoch
            ends only), keep this many, record every step's sample ids (defaults: ``evenflow train``'s).
        rebalance: re-plan from measured per-replica speeds at epoch ends: True, or an
            :class:`evenflow.plan.RebalanceOptions` (``payback=0``: whenever the threshold is met).
        simulate: an :class:`evenflow.run.Simulation` of slow replicas, to try ``rebalance``
            where all devices are equally fast (as ``evenflow train --simulate-slow``).
        class_weight, sample_weight: as for ``model.fit``, exact (:mod:`evenflow.tf.keras.weights`);
            ``validation_data`` may be ``(x_val, y_val, sample_weight_val)``.
        validation_freq: as for ``model.fit``, counting the run's epochs across resumes.
        initial_epoch, steps_per_epoch: set by the plan: 0 and None (or the plan's steps) only.

    Returns:
        A ``keras.callbacks.History`` of every epoch of the run: with ``output_dir``, the
        epochs earlier calls trained too (from ``output_dir/history.json``); a run that has
        trained its ``epochs`` trains nothing and returns its History.
    """
    strategy = _strategy(model)
    _check_options(shuffle, output_dir, checkpoint_every, audit, keep_checkpoints)
    _check_keras_steps(initial_epoch, validation_freq)
    _check_rebalance(rebalance)
    train, val, weights, train_w, val_w = _inputs(x, y, validation_split, validation_data, class_weight,
                                                  sample_weight, stratify)
    callbacks = as_callbacks(callbacks)
    base, val_plan = _plans(strategy, train, val, batch_size, seed, stratify, balance, steps_per_epoch)
    _build(model, strategy, train, base)
    check_workers(strategy, rebalance, simulate, base.topology.replicas)
    recorder = _recorder(model, simulate, base) if output_dir is not None or rebalance or simulate is not None else None
    exact_steps(model, recorder)
    run = _Run(model, base, recorder, epochs, rebalance)
    run.weights, run.validation_freq = train_w, validation_freq
    with contextlib.ExitStack() as stack:
        if output_dir is not None:
            run.open(stack, Path(output_dir), audit, checkpoint_every, keep_checkpoints, _identity(train, val, weights))
            if audit and run.workers.chief:  # evenflow audit --locate maps the trail's ids back to x's rows
                save_id_map(output_dir, source_id_map(_source_of(train), "evenflow.tf.fit's x" if _arrays(train)
                                                      else "", run.identity))
        elif rebalance:
            run.monitor = plan_monitor(base, _rebalance(rebalance), None, False)
        return run.train(_reader_of(train), val, val_plan, verbose, callbacks, val_w)


def _strategy(model):
    check_compiled(model, "first")
    strategy = model.distribute_strategy
    autotune_off_on_devices()  # Keras's per-device iterators: deleting one must not wait up to a minute
    return strategy


def _recorder(model, simulate, base: Plan):
    """Where the steps report what they trained on: device buffers, or host callbacks to emulate slow replicas."""
    if simulate is not None and simulate.active:
        return recorder_of(model, simulate)
    return buffer_of(model, base.options.global_batch_size)


def _check_rebalance(rebalance) -> None:
    if not isinstance(rebalance, (bool, RebalanceOptions)):
        raise TypeError(f"rebalance must be True, False or an evenflow.plan.RebalanceOptions, got {rebalance!r}")


def _check_options(shuffle, output_dir, checkpoint_every, audit, keep_checkpoints) -> None:
    if shuffle is not True:
        raise ValueError(f"shuffle must be True: evenflow plans shuffle every epoch, seeded by seed=, got {shuffle!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an int >= 0 (steps; 0: epoch ends only), got {checkpoint_every!r}")
    if output_dir is None and (audit or checkpoint_every):
        raise ValueError("audit and checkpoint_every write into a run directory: pass output_dir= too")
    if output_dir is None and keep_checkpoints != CheckpointOptions.keep_checkpoints:
        raise ValueError(f"keep_checkpoints={keep_checkpoints!r} sets how many checkpoints a run directory keeps, "
                         f"and there is none: pass output_dir= too, or leave keep_checkpoints out")


def _inputs(x, y, validation_split, validation_data, class_weight, sample_weight, stratify):
    """``(train, val, weights of x, train weights, val weights)``: the sources and weights ``fit`` trains on."""
    source = _reader_or_source(x, y, "evenflow.tf.fit")
    if validation_data is not None and validation_split:
        raise ValueError("pass validation_data or validation_split, not both (model.fit would silently use "
                         "validation_data)")
    if isinstance(source, PlanReader) and validation_split:
        raise ValueError(f"validation_split={validation_split!r} holds out samples of arrays or a source, and x is a "
                         f"{type(source).__name__}, whose functions run on its own records: pass the held-out "
                         f"records as validation_data=evenflow.tf.RecordChain(val_files, parse, ...)")
    weights = sample_weights(_source_of(source), class_weight, sample_weight)
    train, val = split_validation(source, validation_split) if validation_split else (source, None)
    train_w, val_w = _split_weights(train, weights, None if sample_weight is None else val, sample_weight)
    check_stratify(_source_of(train), stratify)
    if validation_data is not None:
        val, val_w = _validation_source(validation_data)
    return train, val, weights, train_w, val_w


def _reader_or_source(x, y, what: str):
    """``x`` itself when it is a reader (a :class:`~evenflow.tf.RecordChain`: your functions on records), else
    :func:`as_source`'s source."""
    if isinstance(x, PlanReader):
        if y is not None:
            raise ValueError(f"{what}: y must be None when x is a {type(x).__name__} (it yields the labels), got "
                             f"{type(y).__name__}")
        return x
    return as_source(x, y, what)


def _source_of(data):
    """The source of a reader, or the source itself."""
    return data.source if isinstance(data, PlanReader) else data


def _reader_of(data):
    """A reader of a source, or the reader itself."""
    return data if isinstance(data, PlanReader) else PlanReader(data)


def _check_keras_steps(initial_epoch, validation_freq) -> None:
    if initial_epoch != 0:
        raise ValueError(f"initial_epoch={initial_epoch!r}: evenflow.tf.fit starts at epoch 0, or where output_dir's "
                         f"newest checkpoint ended (epoch and step); to continue a run, call fit again with the same "
                         f"output_dir= and leave initial_epoch out")
    if isinstance(validation_freq, bool) or not (
            isinstance(validation_freq, int) and validation_freq >= 1 or isinstance(validation_freq, (list, tuple))
            and validation_freq and all(isinstance(e, int) and not isinstance(e, bool) and e >= 1
                                        for e in validation_freq)):
        raise ValueError(f"validation_freq must be an int >= 1 (validate every this many epochs) or a list of "
                         f"epochs >= 1, got {validation_freq!r}")


def _plans(strategy, train, val, batch_size, seed, stratify, balance, steps_per_epoch) -> tuple[Plan, Plan | None]:
    """The training plan and the validation plan (or None) on the strategy's replicas."""
    topology = Topology(int(strategy.num_replicas_in_sync))
    base = Plan(_source_of(train).index(), topology, global_batch_size=batch_size, seed=seed, stratify=stratify, balance=balance)
    _check_steps_per_epoch(steps_per_epoch, base)
    return base, None if val is None else Plan(_source_of(val).index(), topology, global_batch_size=batch_size)


def _check_steps_per_epoch(steps_per_epoch, plan: Plan) -> None:
    if steps_per_epoch is not None and steps_per_epoch != plan.num_steps:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r}: an epoch of evenflow.tf.fit is the plan's "
                         f"{plan.num_steps} steps (every sample once, batch_size per step); leave steps_per_epoch "
                         f"out, or to train fewer samples per epoch pass fewer samples (x[:n], y[:n])")


def _split_weights(train, weights, val, sample_weight):
    """The training weights of ``train`` (the first samples of ``x``) and the validation split's ``sample_weight``."""
    if weights is None:
        return None, None
    n = _source_of(train).num_samples
    return weights[:n], None if val is None else given_weights(sample_weight, n + val.num_samples, "sample_weight")[n:]


def _validation_source(data):
    """``(source, weights or None)`` of ``validation_data``."""
    if isinstance(data, (tuple, list)):
        if len(data) not in (2, 3):
            raise ValueError(f"validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val), an "
                             f"evenflow source or a RecordChain, got a sequence of {len(data)} items")
        source = as_source(data[0], data[1], "validation_data")
        weights = None if len(data) == 2 else given_weights(data[2], source.num_samples, "validation_data's weights")
        return source, weights
    return _reader_or_source(data, None, "validation_data"), None


def _identity(train, val, weights=None) -> str | None:
    """A digest of the arrays trained and validated on, and their weights (None for other sources: only the plan
    is checked)."""
    tf = _tf()
    parts = [] if weights is None else [weights]
    for s in (train, val):
        inner = getattr(s, "source", s)
        if s is not None and not isinstance(inner, ArrayPair):
            return None
        if s is not None:
            parts += tf.nest.flatten((inner._x, inner._y)) + [repr(getattr(s, "ids", None)), s.num_samples]
    return digest(*parts)


def _arrays(source) -> bool:
    return isinstance(getattr(source, "source", source), ArrayPair)


def _build(model, strategy, source, plan: Plan) -> None:
    """Create the model's and optimizer's variables now (a checkpoint restores into them)."""
    tf = _tf()
    if not model.built:
        if isinstance(source, PlanReader):  # your functions make the features: one step of them
            sample = next(iter(source.replica_dataset(plan, None, epochs=1)))
        else:
            ids = list(range(min(2, source.num_samples)))
            sample = reader_source(source).batch(tf.constant(ids, tf.int64))
        try:
            with strategy.scope():
                model(tf.nest.map_structure(tf.convert_to_tensor, sample["features"]), training=False)
        except Exception as e:
            raise ValueError(f"the model is not built and calling it on a batch of the data failed "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); build it first, "
                             f"e.g. model.build((None, *feature_shape)) under strategy.scope()") from None
    if not model.optimizer.built:
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)


def _rebalance(rebalance) -> RebalanceOptions:
    return rebalance if isinstance(rebalance, RebalanceOptions) else RebalanceOptions(enabled=bool(rebalance))


class _Run:
    """The state of one ``fit`` call across the ``model.fit`` calls it makes."""

    def __init__(self, model, base: Plan, recorder, epochs: int, rebalance: bool):
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
        self.model, self.base, self.plan, self.recorder = model, base, base, recorder
        self.epochs, self.rebalance = epochs, rebalance
        self.guard = self.monitor = None
        self.cursor = Cursor(0, 0)
        self.run_dir = None
        self.weights, self.validation_freq = None, 1
        self.workers = FitWorkers(model.distribute_strategy)

    def open(self, stack, run_dir: Path, audit: bool, every: int, keep: int, identity: str | None) -> None:
        workers = self.workers
        directory = RunDirectory(run_dir, chief=workers.chief)
        stack.enter_context(directory.held())
        self.run_dir, self.identity = run_dir, identity
        candidates = resumable(run_dir)
        if candidates:
            latest = check_same_run(candidates, self.base, identity, run_dir, KERAS_FIT, api="keras_fit")
            check_epochs_trained(latest, self.epochs, run_dir, KERAS_FIT)
        self.guard = TrainingGuard.in_run_dir(run_dir, self.base, TFState(self.model, self.model.optimizer),
                                              keep=keep, every=every, audit=audit,
                                              meta={"framework": "tf", "api": "keras_fit", "data": identity},
                                              is_chief=workers.chief, worker=workers.index, background=True)
        # An epoch's checkpoint becomes durable while the next epoch trains; a fit that fails waits for it too.
        stack.callback(self.guard.checkpointer.wait)
        found = self.guard.resume(list(candidates), agreement(workers.all_gather, workers.local)
                                  if workers.count > 1 else None)
        if found is not None:
            self.cursor = found
            if workers.chief:
                print(_resumed(run_dir, found, self.epochs, self.base.num_steps), file=sys.stderr, flush=True)
            self.plan = self.guard.plan_in_use()
        if workers.count == 1:  # telemetry of one process's replicas (several workers: none)
            self.monitor = plan_monitor(self.base, _rebalance(self.rebalance), run_dir, found is not None)
        directory.started = True

    def train(self, reader, val, val_plan, verbose, callbacks, val_weights=None):
        logs = EpochLogs(self.run_dir, self.cursor.epoch, write=self.workers.chief)
        val_kw = {} if val is None else {
            "validation_data": self._dataset(_reader_of(val), val_plan, epochs=1, repeat=True, weights=val_weights),
            "validation_steps": val_plan.num_steps, "validation_freq": list(self.validation_freq) if isinstance(self.validation_freq, tuple) else self.validation_freq}
        keras = _keras()
        own = [] if any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks) else \
            [progress_bar(self.epochs)]
        if self.monitor is not None:  # a re-plan must pay for itself over the steps left
            self.monitor.total_steps = self.epochs * self.base.num_steps
        while self.cursor.epoch < self.epochs:
            cursor = self.cursor
            stop = cursor.epoch + 1 if cursor.step > 0 else self.epochs
            watcher = None if self.recorder is None else \
                PlanCallback.create(self.plan, self.base, self.recorder, cursor, self.guard, self.monitor,
                                    self.workers)
            data = self._dataset(reader, self.plan, epochs=stop - cursor.epoch, start=cursor, weights=self.weights)
            self._fit(data, epochs=stop, initial_epoch=cursor.epoch, verbose=verbose, shuffle=False,
                      steps_per_epoch=self.plan.num_steps - cursor.step, **val_kw,
                      callbacks=[self.workers.watch_callback()] + ([watcher] if watcher is not None else [])
                      + [logs.callback()] + own + callbacks)
            self.cursor = watcher.cursor if watcher is not None else Cursor(stop, 0)
            if watcher is not None and watcher.replan is not None:
                self._adopt(watcher.replan)
            elif self.model.stop_training and self.cursor.epoch < self.epochs:
                break  # a callback (e.g. EarlyStopping) ended training
        if self.guard is not None:
            self.guard.finish(self.cursor)
        if self.monitor is not None:
            self.monitor.close()
        return logs.history(self.model)

    def _fit(self, data, **kw) -> None:
        """``model.fit``; a peer lost under several workers raises one line that says how to resume."""
        try:
            self.model.fit(data, **kw)
        except Exception as e:
            failure = self.workers.failure(e, self.run_dir)
            if failure is None:
                raise
            raise failure from None

    def _dataset(self, reader, plan, **kw):
        """The plan's batches for Keras: a dataset of global steps, or per worker under several workers."""
        strategy = self.model.distribute_strategy
        if self.workers.count > 1:
            return keras_worker_dataset(strategy, reader, plan, **kw)
        return keras_dataset(reader, plan, **kw)

    def _adopt(self, decision) -> None:
        before = tuple(self.plan.topology.weights or (1.0,) * self.plan.topology.replicas)
        self.plan = self.base.with_topology(Topology(self.base.topology.replicas, decision.weights))
        self.monitor.replanned(self.cursor, before, decision)
        if self.guard is not None:
            self.guard.weights = tuple(self.plan.topology.weights)


def _resumed(run_dir: Path, found: Cursor, epochs: int, steps: int) -> str:
    """The line a call that continues ``run_dir`` prints: where it resumes, or that the run is done."""
    if found.epoch >= epochs:
        return (f"evenflow.tf.fit: {run_dir} has trained all {epochs} epochs; nothing to train (pass a larger epochs= "
                f"to train on); returning its History")
    return (f"evenflow.tf.fit: resuming from {run_dir}'s checkpoint at epoch {found.epoch} step {found.step} "
            f"(Keras's Epoch {found.epoch + 1}/{epochs})"
            + (f" (that epoch's figures cover its remaining {steps - found.step} steps)" if found.step else ""))
