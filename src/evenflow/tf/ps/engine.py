"""Parameter-server training: the plan's steps as closures, run by whichever worker is free.

:class:`PSEngine` implements :class:`evenflow.run.loop.Engine` on the *coordinator* (the
chief) of a ``tf.distribute.ParameterServerStrategy`` cluster. The model's variables live on
the parameter servers (split across them by the strategy's ``variable_partitioner``); the
workers only compute. Each plan step is one closure, scheduled with
``ClusterCoordinator.schedule`` and given the step's whole batch (read on the chief from the
training ``Source``), so

* a fast worker takes more steps than a slow one, without any re-planning: the coordinator
  hands the next closure to the first free worker;
* each step's outputs come back once, whichever worker ran it: the chief records them (loss
  sums, ids for the audit) when it reads them, so the audit shows every step once; when a
  worker dies mid-step, the coordinator runs its closure again on another worker. A step
  whose update reached the parameter servers before the worker died may then be applied
  twice to some variables: TensorFlow retries a closure, it cannot undo part of one.
* updates are asynchronous: up to ``in_flight`` steps run at once, each on the variables as
  they are when it starts. The loss is the masked mean over the step's real samples; a step
  whose loss or gradients are non-finite is not applied (decided inside the closure).

The plan of a parameter-server run has one replica (a step is one update of the global
batch); the chief is the only process that runs the training loop.
"""
from __future__ import annotations

import contextlib
import warnings

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.run.engine import Stream
from evenflow.run.options import AnomalyOptions
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.replica_step import masked_sums
from evenflow.util.validate import check_int


class PSReader:
    """What the engine reads a set with on the chief: an evenflow ``Source`` (numpy batches)."""

    def __init__(self, source):
        self.source = source


def _inputs(batch: dict):
    """The model's inputs: the features, or for token sequences ``(tokens, length)`` with the tokens
    padded to a power of two >= 16 (a few shapes, so the step function is traced a few times only)."""
    if "length" not in batch:
        return batch["features"]
    tokens = np.asarray(batch["features"])
    width = max(16, 1 << max(int(tokens.shape[1]) - 1, 0).bit_length())
    padded = np.zeros((tokens.shape[0], width), tokens.dtype)
    padded[:, :tokens.shape[1]] = tokens
    return padded, np.asarray(batch["length"], np.int64)


def _rows(source, plan, start: Cursor, epochs: int):
    """``(ids [slots], inputs, labels, mask)`` of every step from ``start`` through epoch ``epochs - 1``."""
    for epoch in range(start.epoch, epochs):
        ep = plan.epoch(epoch)
        for step in range(start.step if epoch == start.epoch else 0, plan.num_steps):
            ids = ep.ids[step].reshape(-1)
            real = ids >= 0
            batch = source.batch(np.where(real, ids, ids[real][0] if real.any() else 0))
            yield ids, _inputs(batch), np.asarray(batch["label"], np.int64), real.astype(np.float32)


def _tensors(x, y, mask) -> tuple:
    """A step's closure arguments: its inputs (an array, or tokens and lengths), labels and mask as tensors."""
    tf = _tf()
    return tf.nest.map_structure(tf.constant, x), tf.constant(y), tf.constant(mask)


#: How many times the chief tries to copy a finished step's outputs from its worker.
FETCH_TRIES = 3


def fetch(remote, what: str):
    """``remote.fetch()``, tried again when the copy of a finished closure's outputs to the chief fails.

    The outputs stay on the worker until they are copied, so a copy that failed in transit (gRPC
    ``Unable to parse request``, a cancelled receive) can be made again; the closure is not re-run.
    An error of the closure itself is raised at once, as is the last copy's error.
    """
    tf = _tf()
    for attempt in range(1, FETCH_TRIES + 1):
        try:
            return remote.fetch()
        except (tf.errors.InternalError, tf.errors.UnavailableError, tf.errors.CancelledError) as e:
            if attempt == FETCH_TRIES or getattr(remote, "_error", None) is not None:
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            warnings.warn(f"copying {what} from its worker failed ({type(e).__name__}: {first}); "
                          f"trying again ({attempt} of {FETCH_TRIES - 1})", RuntimeWarning, stacklevel=2)


class PSEngine:
    """Runs ``model`` on a parameter-server cluster for :class:`evenflow.run.loop.TrainLoop`.

    Args:
        strategy: a ``tf.distribute.ParameterServerStrategy``.
        model: a callable ``tf.Module`` (features -> logits) created under ``strategy.scope()``.
        optimizer: a Keras optimizer created under ``strategy.scope()`` and built on the model's
            trainable variables.
        in_flight: steps scheduled ahead of the one the chief reads, >= 1.
        anomaly: :class:`~evenflow.run.options.AnomalyOptions`; with ``skip_nonfinite``, a step whose
            loss or gradients are non-finite is not applied.
        coordinator: its ``ClusterCoordinator`` (None: a new one).
    """

    def __init__(self, strategy, model, optimizer, in_flight: int, anomaly: AnomalyOptions, coordinator=None):
        tf = _tf()
        check_int("in_flight", in_flight, 1)
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.coordinator = coordinator or tf.distribute.coordinator.ClusterCoordinator(strategy)
        self.local_replicas, self.num_processes, self.lag = 1, 1, in_flight
        self.timing, self.skip_nonfinite, self.can_switch = False, anomaly.skip_nonfinite, False
        self._train = tf.function(self._train_closure)
        self._eval = tf.function(self._eval_closure)

    # -- closures (run on a worker) ------------------------------------------------------------------
    def _train_closure(self, x, y, mask):
        # The skip is decided outside strategy.run: a Keras optimizer's apply (a merge_call) cannot sit
        # inside control flow within the replica function.
        tf = _tf()
        sums, flags, suspect, grads = self.strategy.run(self._gradients, args=(x, y, mask))
        variables = self.model.trainable_variables

        def apply():
            self.strategy.run(lambda *g: self.optimizer.apply_gradients(zip(g, variables)), args=tuple(grads))
            return tf.constant(0.0)

        skip = tf.logical_and(flags[0] > 0, self.skip_nonfinite)
        skipped = tf.cond(skip, lambda: tf.constant(1.0), apply)
        return sums, tf.stack([flags[0], flags[1], skipped]), suspect

    def _gradients(self, x, y, mask):
        tf = _tf()
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x), tf.float32)
            per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            loss = tf.reduce_sum(per_sample * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)
        grads = tape.gradient(loss, self.model.trainable_variables)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads] + [tf.math.is_finite(loss)])
        suspect = tf.logical_and(mask > 0, tf.logical_not(tf.math.is_finite(per_sample)))
        bad = 1.0 - tf.cast(finite, tf.float32)
        return masked_sums(mask, y, logits, per_sample), tf.stack([bad, bad, 0.0]), suspect, grads

    def _eval_closure(self, x, y, mask):
        return self.strategy.run(self._eval_replica, args=(x, y, mask))

    def _eval_replica(self, x, y, mask):
        tf = _tf()
        logits = tf.cast(self.model(x), tf.float32)
        return masked_sums(mask, y, logits, tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    # -- the loop's interface (on the chief) -----------------------------------------------------------
    def open(self, reader: PSReader, plan, start: Cursor, epochs: int, switchable: bool = False):
        if switchable:
            raise ValueError("a parameter-server run does not switch plans: free workers take the next step")
        return Stream(_rows(reader.source, plan, start, start.epoch + epochs))

    def update(self, stream, global_step: int, count: int, keep_batches: bool):
        if count != 1:
            raise ValueError("a parameter-server step is one update: accumulate_steps must be 1")
        ids, x, y, mask = next(stream.iterator)
        out = {"remote": self.coordinator.schedule(self._train, args=_tensors(x, y, mask)), "ids": ids,
               "real": float(mask.sum())}
        return [out], [{"features": x, "label": y, "id": ids, "mask": mask}] if keep_batches else None

    def read(self, out, with_ids: bool) -> dict:
        # Waits for this step's closure (run once, or re-run on another worker if its worker died).
        sums, flags, suspect = fetch(out["remote"], "a training step's outputs")
        row = {"sums": np.asarray(sums, np.float64)[None, :], "flags": np.asarray(flags, np.float64)[None, :]}
        if with_ids:
            row.update(ids=out["ids"][None, :].astype(np.int64), nonfinite=np.asarray(suspect, bool)[None, :],
                       replica=np.zeros(1, np.int64))
        return row

    def sums(self, outs: list):
        # The real count is known on the chief; the loss and hits come with read(), once the step has run.
        return np.array([[0.0, 0.0, sum(o["real"] for o in outs)]])

    def close(self, stream, finished: bool) -> None:
        self.coordinator.join()  # a dropped stream's scheduled steps still finish (their outputs are not read)

    def evaluate(self, reader: PSReader, plan, epoch: int) -> np.ndarray:
        remotes = [self.coordinator.schedule(self._eval, args=_tensors(x, y, m))
                   for _, x, y, m in _rows(reader.source, plan, Cursor(epoch, 0), epoch + 1)]
        return np.sum([np.asarray(fetch(r, "an evaluation step's sums"), np.float64) for r in remotes],
                      axis=0)[None, :]

    def all_gather(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, np.float64)

    def running(self):
        return contextlib.nullcontext()
