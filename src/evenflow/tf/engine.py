"""The TensorFlow side of the training loop: traced ``strategy.run`` steps over per-replica pipelines.

:class:`TFEngine` implements :class:`evenflow.run.loop.Engine` for a ``tf.distribute``
strategy (MirroredStrategy on one worker, MultiWorkerMirroredStrategy on several): it opens
the reader's distributed stream of a plan, dispatches one update of ``count`` plan steps as
one traced function that also pulls the batches from the iterator, reads the step outputs
back as numpy, evaluates, and all-gathers small rows across workers.

Step outputs stay tensors until the loop reads them: reading one back every step would make
the host wait for each step before dispatching the next (an accelerator would idle). On CPU
devices a step's call returns only once the step has run, so nothing would overlap anyway:
there the loop reads at once (``lag`` 0), and the speed monitor re-plans two updates sooner.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.feed import PlanFeed
from evenflow.run.engine import Stream
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.clock import now
from evenflow.tf.input.pyfunc import closing as pipelines_closing
from evenflow.tf.strategy import collective_watch, local_replicas, num_workers, on_cpu

# On accelerators the host reads each step's outputs this many updates behind the newest
# dispatched one: anomalies are seen promptly without making the host wait for every step.
LAG = 2
# Python's GIL switch interval while timed steps run (see TFEngine.running), seconds.
TIMING_SWITCH_SECONDS = 0.0005


class TFEngine:
    """Runs a :class:`~evenflow.tf.replica_step.ReplicaStep` under ``strategy`` (see the module docstring).

    Args:
        strategy: a ``tf.distribute`` strategy.
        step: the :class:`~evenflow.tf.replica_step.ReplicaStep` (model, optimizer, options).
    """

    def __init__(self, strategy, step):
        tf = _tf()
        self.strategy, self.step = strategy, step
        self.local_replicas = local_replicas(strategy)
        self.num_processes = num_workers(strategy)
        self.lag = 0 if on_cpu(strategy) else LAG
        # Every call below that may wait for the other workers runs under the collective timeout.
        self._watch = collective_watch(strategy)
        self.timing, self.skip_nonfinite = step.timing, step.skip_nonfinite
        self.can_switch = True  # open(..., switchable=True) streams read their rows from a PlanFeed
        # Whether steps output ids, suspects and replica ids (read() with_ids): the trainer turns it
        # off for a run that never asks for them (no guard, no monitor of costs).
        self.with_ids = True
        self._feed = None  # the feed of the stream last updated from (told each update's step and input wait)
        # autograph=False: the steps branch with tf.cond only (never `if tensor:`), and skipping
        # AutoGraph's source conversion makes the first call (the trace) 35-70% faster, paid by every
        # process. reduce_retracing: batches passed in from Python carry their concrete shapes, and
        # variable-length batches would otherwise retrace for every new length. One function per
        # `ids`, of one argument (the tuple of batches): a call binds its arguments to the traced
        # signature in Python, and varargs with keywords cost ~1,000 Python calls a step more.
        self._given = {ids: _per_engine(tf.function(_bound(self._distributed_train, ids), autograph=False,
                                                    reduce_retracing=True)) for ids in (True, False)}
        # The same step taking the iterator: next() inside the function saves the Python-side
        # get_next of R per-replica iterators. `count` (micro-steps of one update) is a Python int:
        # one trace per group length (k, and an epoch's shorter last group).
        self._train_next = _per_engine(tf.function(self._train_from, autograph=False))
        self._eval_next = _per_engine(tf.function(
            lambda iterator: self._gather(strategy.run(step.evaluate, args=(next(iterator),))), autograph=False))
        self._all_gather = _per_engine(tf.function(lambda values: strategy.gather(values, axis=0)))

    # -- the loop's interface --------------------------------------------------------------------
    def open(self, reader, plan, start: Cursor, epochs: int, switchable: bool = False):
        # A switchable stream's pipelines read their rows from a feed (see evenflow.plan.feed); a
        # request held while the loop switches plans waits in the pipeline's own thread.
        feed = PlanFeed(plan, start, start.epoch + epochs, block=True, closing=pipelines_closing, paced=True) \
            if switchable else None
        return Stream(iter(reader.distribute(self.strategy, plan, start=start, epochs=epochs, feed=feed)), feed)

    def update(self, stream, global_step: int, count: int, keep_batches: bool):
        tf = _tf()
        self._feed = stream.feed
        if stream.feed is not None:  # bounds how far its pipelines read ahead of this update
            stream.feed.advance(global_step + count - 1)
        stream = stream.iterator
        with self._watch.waiting():
            if not keep_batches:
                at = tf.constant(global_step, tf.int64) if self.timing else None
                return list(self._train_next(stream, count, at, self.with_ids)), None
            batches = [next(stream) for _ in range(count)]
            return list(self._train_batches(*batches, ids=self.with_ids)), batches

    def read(self, out, with_ids: bool) -> dict:
        with self._watch.waiting():
            row = {k: v.numpy() for k, v in out.items() if with_ids or k in ("sums_flags", "timing")}
        both = row.pop("sums_flags")  # one output per step: [loss sum, hits, real count, flags x 3]
        row["sums"], row["flags"] = both[:, :3], both[:, 3:]
        if self._feed is not None and "timing" in row:  # began, ready, ...: the update's input wait
            self._feed.waited(float(np.max(row["timing"][:, 1] - row["timing"][:, 0])))
        return row

    def sums(self, outs: list):
        sums = [o["sums_flags"][:, :3] for o in outs]
        return sums[0] if len(sums) == 1 else sum(sums)

    def close(self, stream, finished: bool) -> None:
        if finished:
            _drain(stream.iterator)
        if stream.feed is not None:
            stream.feed.close()  # a request waiting for training to move on returns (an error nobody reads)
        # Dropped mid-way (a rewind or a re-plan): deleting an iterator while the interpreter runs
        # normally is safe, with or without Python calls in flight (see evenflow.tf.input.pyfunc).
        del stream

    def evaluate(self, reader, plan, epoch: int) -> np.ndarray:
        stream = iter(reader.distribute(self.strategy, plan, start=Cursor(epoch, 0), epochs=1))
        totals = np.zeros((self.local_replicas, 3))
        for _ in range(plan.num_steps):
            with self._watch.waiting():
                totals += self._eval_next(stream).numpy()
        _drain(stream)
        return totals

    def all_gather(self, rows: np.ndarray) -> np.ndarray:
        """float64 ``[local replicas, k]`` -> ``[all replicas, k]``; worker w holds replicas ``w*R .. w*R+R-1``."""
        if self.num_processes == 1:
            return np.asarray(rows, dtype=np.float64)
        tf = _tf()
        rows = np.asarray(rows, dtype=np.float64)
        values = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[ctx.replica_id_in_sync_group % self.local_replicas][None]))
        with self._watch.waiting():
            return self._all_gather(values).numpy()

    @contextlib.contextmanager
    def running(self):
        """While training: a short GIL switch interval when steps are timed.

        The clock callbacks of timed steps run Python on TensorFlow's threads; while the host
        thread runs Python (settling steps, telemetry) they wait for the GIL, by default up to
        5 ms per hand-over. A 0.5 ms interval cut that wait (digits at 4 replicas on 2 cores:
        4,169 -> 5,579 samples/s).
        """
        switch = sys.getswitchinterval()
        if self.timing:
            sys.setswitchinterval(min(switch, TIMING_SWITCH_SECONDS))
        try:
            yield
        finally:
            sys.setswitchinterval(switch)

    # -- traced steps ---------------------------------------------------------------------------
    def _train_batches(self, *batches, ids=True):
        """One update from ``batches`` fetched in Python: a tuple of one output dict per step."""
        return self._given[bool(ids)](batches)

    def _distributed_train(self, *batches, clock=None, step=None, ids=True):
        """One update from ``batches`` (consecutive plan steps): a tuple of one output dict per step."""
        tf = _tf()
        kwargs = {} if ids else {"with_ids": False}
        if self.timing:
            if clock is None:
                t = now()
                clock = tf.stack([t, t])
            kwargs.update(clock=clock, step=tf.constant(0, tf.int64) if step is None else step)
        outs = self._gather(self.strategy.run(self.step.train, args=batches, kwargs=kwargs))
        if self.timing:
            # The step's end, once every replica's outputs (after the update) exist: one column more.
            with tf.control_dependencies(tf.nest.flatten(outs)):
                end = now()
            timing = outs[-1]["timing"]
            outs[-1]["timing"] = tf.concat([timing, tf.fill([tf.shape(timing)[0], 1], end)], 1)
        return outs

    def _train_from(self, iterator, count=1, step=None, ids=True):
        # The update from the next `count` batches of `iterator`, timing how long they took to arrive.
        tf = _tf()
        began = now() if self.timing else None
        batches = [next(iterator) for _ in range(count)]
        clock = None
        if self.timing:
            if "produced" in batches[0]:
                # A stamped pipeline (PlanReader(stamp=True)) says when each batch was made: the step
                # waited only for those made after it began. A clock callback run once the batches
                # have arrived would measure more: it queues behind the replicas' first ops.
                made = [t for b in batches for t in self.strategy.experimental_local_results(b["produced"])]
                clock = tf.stack([began, tf.maximum(began, tf.reduce_max(tf.stack(made)))])
            else:
                arrived = [t for b in batches for t in self.strategy.experimental_local_results(b["mask"])]
                with tf.control_dependencies(arrived):
                    clock = tf.stack([began, now()])
        return self._distributed_train(*batches, clock=clock, step=step, ids=ids)

    def _gather(self, per_replica):
        # Stack instead of strategy.reduce: the host gets the per-replica rows and sums them itself.
        # A dict of outputs is stacked key by key: [local replicas, ...] each.
        tf = _tf()
        return tf.nest.map_structure(lambda t: _stack_padded(self.strategy.experimental_local_results(t)),
                                     per_replica)


def _bound(train, ids: bool):
    """``train(*batches, ids=ids)`` as a function of the one tuple ``batches``."""
    return lambda batches: train(*batches, ids=ids)


def _per_engine(function):
    """``function``, a ``tf.function`` of one engine, without TensorFlow's warning of frequent retracing.

    TensorFlow counts the traces of every ``tf.function`` made from the same code together, so
    several trainers in one process (a sweep, a notebook, tests), each tracing its own functions
    once for its own model, read to it as one function retraced often. Each engine's functions
    trace once per model and batch layout by construction; the warning would be a false alarm.
    """
    function._omit_frequent_tracing_warning = True  # tf.function's own switch (TF 2.x)
    return function


def _drain(stream) -> None:
    """Read a finished stream to its end before it is deleted.

    Deleting an iterator waits for its in-flight work with the GIL held; a source
    that runs Python in the pipeline (``tf.numpy_function``) could then deadlock.
    At the end of the stream nothing is in flight.
    """
    for _ in stream:
        raise RuntimeError("the input pipeline yielded more batches than the plan has steps; "
                           "please report this as a bug")


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
