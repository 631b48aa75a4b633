"""Execute an :class:`~evenflow.plan.plan.EpochPlan` with ``tf.data``: one pipeline per replica.

Replica r reads row ``ids[:, r, :]`` of the plan, one step at a time: each element
is the whole per-replica batch of that step, loaded with one vectorised call to the
source (a gather, not a per-example map, which measured about 25x slower; see
docs/benchmarks.md).

A batch is a dict of tensors whose first axis is the replica's ``slots`` (its real
count in that step with ``trim_padding``):

* whatever the source returns, at least ``features`` and ``label``;
* ``id``: int64 ``[slots]`` sample ids, -1 for padding;
* ``mask``: float32 ``[slots]``, 1 for real samples, 0 for padding;
* ``global_real_count``: int64 scalar, real samples of this step over all replicas
  (``EpochPlan.global_real_counts``) — the denominator of the masked loss;
* ``epoch``: int64 scalar, so augmentations can be keyed by (seed, epoch, id);
* ``produced`` (with ``stamp=True``): float64 scalar, the host clock (``time.time()``)
  when the batch left the last map function, before the prefetch buffer. A training
  step that began at ``t`` waited ``max(0, produced - t)`` for this batch: a batch that
  sat in the buffer cost no wait.

A pipeline can stream many epochs from a :class:`~evenflow.plan.cursor.Cursor`
(:meth:`PlanReader.distribute`), planning each epoch when it reaches it.

Under several workers (MultiWorkerMirroredStrategy) each worker runs one pipeline
that interleaves the rows of its own replicas (:meth:`PlanReader.worker_dataset`);
each replica still receives exactly its row.

Padding slots load a valid dummy row (another sample of the same batch) so every
op sees well-formed data; the mask removes them from loss and metrics.

The rows come from :class:`~evenflow.plan.epoch_rows.EpochRows`, which plans each epoch
once for all replicas; :func:`~evenflow.tf.input.pipeline.load_batches` turns them into batches.

Sources follow a three-member protocol: ``num_samples``, ``index()``, ``batch(ids)``. The
reader takes any :class:`evenflow.data.Source` (e.g. an ``ArraySource`` or a ``RecordSource``), which
it turns into TensorFlow ops itself (:func:`~evenflow.tf.input.source_adapter.tf_source`), or a
TensorFlow source of your own (:class:`~evenflow.tf.input.sources.TensorSource`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from evenflow.plan import Cursor, EpochPlan, Plan
from evenflow.plan.epoch_rows import EpochRows, check_epochs
from evenflow.plan.feed import PlanFeed
from evenflow.util.validate import check_bool, check_int
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.chain_fns import check_batch_fn
from evenflow.tf.input.device_iterators import install as autotune_off_on_devices
from evenflow.tf.input.feed_rows import feed_rows
from evenflow.tf.input.pipeline import MapFn, load_batches
from evenflow.tf.input.pyfunc import numpy_function
from evenflow.tf.input.source_adapter import reader_source
# Re-exported: the source protocol is part of the reader's interface.
from evenflow.tf.input.sources import TensorSource
from evenflow.tf.strategy import check_strategy, local_replicas, on_cpu


class PlanReader:
    """Turns plans into ``tf.data`` pipelines, one per replica.

    A pipeline can stream many epochs from a cursor. With a given number of
    epochs their rows are planned when the dataset is built and fed as constants,
    so no Python runs inside the pipeline. Only endless streams (``epochs=None``)
    plan on the fly, in a :func:`evenflow.tf.input.pyfunc.numpy_function` callback: a
    plain ``tf.numpy_function`` that runs when the interpreter shuts down hangs
    the process at exit (see :mod:`evenflow.tf.input.pyfunc`).
    One long-lived pipeline per run also saves time: building a distributed dataset
    measured 0.5-2.5 s, several epochs of a small dataset. A re-plan with measured
    weights does not rebuild it either: with a :class:`~evenflow.plan.feed.PlanFeed`
    (:meth:`feed_dataset`) the pipelines read each step's row from the feed, which
    switches the weights from a later step on.

    Args:
        source: an :class:`evenflow.data.Source` (numpy), which is read through :func:`~evenflow.tf.input.source_adapter.tf_source`; see
            :func:`~evenflow.tf.input.source_adapter.reader_source` for how it is told apart from a
            TensorFlow :class:`TensorSource` of your own, which is read as it is.
        map_fns: functions ``fn(batch: dict) -> dict`` applied in order to every
            batch (augmentation, normalisation), or one such function, each with
            ``num_parallel_calls=AUTOTUNE``. They see all batch keys, including
            ``id`` and ``epoch``, and must keep the reserved keys.
        prefetch: batches to prefetch per replica, >= 1. The default, 4, is deeper than
            usual because tf.data's autotuner is off in these pipelines (see
            :func:`~evenflow.tf.input.pipeline.load_batches`); deeper buffers measured faster
            while other work shared the cores (see docs/benchmarks.md).
        trim_padding: drop the padding slots of each replica's batch, so its leading
            axis is the replica's real count in that step (at least 1: a step with no
            real sample keeps one masked dummy row). Padding then costs no compute,
            which matters when weighted plans give replicas different counts: a
            replica with fewer samples finishes sooner instead of computing its
            padding. The leading axis is then dynamic (``None``), so replanning with
            other weights does not retrace the training step.
        stamp: add ``produced`` to every batch (one Python callback per batch, in the
            pipeline's threads), from which :class:`~evenflow.tf.trainer.Trainer` with
            ``timing`` measures how long each step waited for its input.
    """

    def __init__(self, source: TensorSource, map_fns: Sequence[MapFn] = (), prefetch: int = 4,
                 trim_padding: bool = False, stamp: bool = False):
        source = reader_source(source)
        map_fns = (map_fns,) if callable(map_fns) else tuple(map_fns)  # one function, or several in order
        for i, fn in enumerate(map_fns):
            if not callable(fn):
                raise TypeError(f"map_fns[{i}] must be a function batch -> batch, got {type(fn).__name__}")
            check_batch_fn(fn, f"map_fns[{i}]")
        check_int("prefetch", prefetch, 1, fix="batches per replica")
        self.trim_padding, self.stamp = check_bool("trim_padding", trim_padding), check_bool("stamp", stamp)
        self.source, self.map_fns, self.prefetch = source, map_fns, prefetch

    def _check(self, plan: Plan) -> None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
        if plan.options.pack:
            raise ValueError(f"PlanReader reads unpacked plans; this plan packs rows of {plan.options.pack} tokens: "
                             f"read it with evenflow.tf.packed_dataset(source, plan, replica)")
        if plan.index.num_samples != self.source.num_samples:
            raise ValueError(f"the plan covers {plan.index.num_samples} samples but the source has "
                             f"{self.source.num_samples}; plan with source.index()")

    def replica_dataset(self, plan: Plan, replica: int | None, start: Cursor | None = None,
                        epochs: int | None = None, rows: EpochRows | None = None):
        """The ``tf.data.Dataset`` that replica ``replica`` trains on.

        Args:
            plan: the plan; its topology decides the rows.
            replica: replica index in ``[0, R)``, or None for whole global steps
                (every replica's slots in replica order, ``R * slots`` per batch).
            start: first step to read (default ``Cursor(0, 0)``).
            epochs: number of epochs to read from ``start.epoch`` (the first one
                possibly partial), planned now: 8 bytes per slot of host memory.
                None streams without end, planning each epoch when the pipeline
                reaches it (in Python, through :func:`evenflow.tf.input.pyfunc.numpy_function`,
                which keeps the process from hanging at exit).
            rows: internal; shares planned epochs between replicas.

        Returns:
            A dataset of batch dicts (see module docstring), one per global step,
            with leading axis ``plan.slots`` (``R * plan.slots`` when ``replica`` is None).
        """
        tf = _tf()
        self._check(plan)
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor or None, got {start!r}")
        r_count = plan.topology.replicas
        if replica is not None:
            check_int("replica", replica, 0, r_count - 1, fix=f"a plan of {r_count} replicas")
        check_epochs(epochs, endless=True)
        replica, epochs = (None if v is None else int(v) for v in (replica, epochs))
        if start.step > plan.num_steps:
            raise ValueError(f"start cursor step must be at most the epoch's {plan.num_steps} steps, got {start.step}")
        if epochs is not None:
            rows = EpochRows(plan, start, keep=epochs) if rows is None else rows
            columns = rows.columns(range(start.epoch, start.epoch + epochs), replica)
            return self._load(tf.data.Dataset.from_tensor_slices(columns))

        rows = EpochRows(plan, start) if rows is None else rows
        width = plan.slots * (r_count if replica is None else 1)

        def epoch_rows(epoch):
            ids, counts = numpy_function(lambda e: rows.rows(e, replica), [epoch], [tf.int64, tf.int64],
                                         stateful=True)
            ids = tf.ensure_shape(ids, [None, width])
            counts = tf.ensure_shape(counts, [None])
            return tf.data.Dataset.from_tensor_slices(
                {"id": ids, "global_real_count": counts, "epoch": tf.fill(tf.shape(counts), epoch)})

        return self._load(tf.data.Dataset.counter(start.epoch, dtype=tf.int64).flat_map(epoch_rows))

    def worker_dataset(self, plan: Plan, replicas: range, start: Cursor | None = None, epochs: int = 1,
                       rows: EpochRows | None = None):
        """The ``tf.data.Dataset`` of one worker of a multi-worker run: the rows of its replicas.

        Element ``k`` is the batch of replica ``replicas[k % len(replicas)]`` at step
        ``k // len(replicas)``: ``distribute_datasets_from_function`` hands a worker's
        consecutive elements to its consecutive replicas, so each replica still reads
        exactly its own row of the plan.

        Args:
            plan: the plan of all replicas of all workers.
            replicas: global ids of this worker's replicas, e.g. ``range(2, 4)`` for
                worker 1 of a cluster with 2 replicas per worker.
            start: first step to read (default ``Cursor(0, 0)``).
            epochs: number of epochs to read from ``start.epoch``, >= 0.
            rows: internal; shares planned epochs.

        Returns:
            A dataset of per-replica batch dicts with leading axis ``plan.slots``,
            ``len(replicas)`` elements per global step.
        """
        tf = _tf()
        self._check(plan)
        start = Cursor(0, 0) if start is None else start
        r_count = plan.topology.replicas
        if not isinstance(replicas, range) or len(replicas) < 1 or replicas.step != 1 \
                or not 0 <= replicas.start < replicas.stop <= r_count:
            raise ValueError(f"replicas must be a non-empty range of consecutive replica ids within [0, {r_count}), "
                             f"got {replicas!r}")
        check_epochs(epochs, endless=False)
        if start.step > plan.num_steps:
            raise ValueError(f"start cursor step must be at most the epoch's {plan.num_steps} steps, got {start.step}")
        rows = EpochRows(plan, start, keep=epochs) if rows is None else rows
        columns = rows.columns(range(start.epoch, start.epoch + epochs), replicas)
        return self._load(tf.data.Dataset.from_tensor_slices(columns), prefetch=self.prefetch * len(replicas))

    def epoch_dataset(self, ep: EpochPlan, replica: int | None):
        """Like :meth:`replica_dataset` for one ready :class:`EpochPlan` (no on-the-fly planning)."""
        tf = _tf()
        if replica is not None:
            check_int("replica", replica, 0, ep.replicas - 1, fix=f"a plan of {ep.replicas} replicas")
        replica = None if replica is None else int(replica)
        ids = ep.ids.reshape(ep.num_steps, -1) if replica is None else ep.ids[:, replica, :]
        counts = ep.global_real_counts.astype(np.int64)
        return self._load(tf.data.Dataset.from_tensor_slices({
            "id": np.ascontiguousarray(ids, dtype=np.int64), "global_real_count": counts,
            "epoch": np.full(counts.shape, ep.epoch, dtype=np.int64)}))

    def feed_dataset(self, feed: PlanFeed, replicas: int | range):
        """The dataset of one replica (an int) or one worker's replicas (a range) reading ``feed``.

        The rows come from the feed in blocks of up to :data:`~evenflow.tf.input.feed_rows.FEED_BLOCK`
        steps (one Python call per block), so the feed can switch the plan's weights mid-stream
        without rebuilding the pipeline; the batches' leading axis is dynamic. A consumer that
        tells the feed its step (:meth:`~evenflow.plan.feed.PlanFeed.advance`) bounds how far the
        pipeline reads ahead, and so how many steps a switch lands after its decision. Elements
        are ordered as in :meth:`replica_dataset` and :meth:`worker_dataset`.
        """
        n = 1 if isinstance(replicas, int) else len(replicas)
        rows_ds = feed_rows(feed, replicas)
        if not isinstance(replicas, int):
            rows_ds = rows_ds.unbatch()
        return self._load(rows_ds, prefetch=self.prefetch * n)

    def _load(self, rows_ds, prefetch: int | None = None):
        return load_batches(rows_ds, self.source, self.map_fns, trim_padding=self.trim_padding, stamp=self.stamp,
                            prefetch=self.prefetch if prefetch is None else prefetch)

    def distribute(self, strategy, plan: Plan, start: Cursor | None = None, epochs: int | None = None,
                   feed: PlanFeed | None = None):
        """A distributed dataset that feeds replica r exactly row ``ids[:, r, :]`` of the plan.

        One worker (MirroredStrategy): ``distribute_datasets_from_function`` in
        ``PER_REPLICA`` mode, one pipeline per replica (``replica_dataset(plan, r, ...)``).
        Several workers (MultiWorkerMirroredStrategy, which has no ``PER_REPLICA``
        mode): one pipeline per worker (:meth:`worker_dataset`) over the rows of that
        worker's replicas ``w * R .. w * R + R - 1``. Every worker computes the same
        plan (it is deterministic), so no ids travel between workers.

        With a ``feed`` (:class:`~evenflow.plan.feed.PlanFeed` of ``plan`` from ``start``), the
        pipelines read their rows from it (:meth:`feed_dataset`) instead of planned constants.

        Returns:
            A ``tf.distribute.DistributedDataset``; one element per global step.
        """
        tf = _tf()
        check_strategy(strategy, "PlanReader.distribute")
        self._check(plan)
        check_epochs(epochs, endless=True)
        if strategy.num_replicas_in_sync != plan.topology.replicas:
            raise ValueError(f"the plan was made for {plan.topology.replicas} replicas but the strategy has "
                             f"{strategy.num_replicas_in_sync}; plan with evenflow.tf.topology_of(strategy)")
        start = Cursor(0, 0) if start is None else start
        rows = EpochRows(plan, start, keep=epochs if epochs is not None else 3)
        local = local_replicas(strategy)
        multi_worker = strategy.num_replicas_in_sync > local

        def dataset_fn(ctx):
            if feed is not None:
                return self.feed_dataset(feed, range(ctx.input_pipeline_id * local, (ctx.input_pipeline_id + 1) * local)
                                         if multi_worker else ctx.input_pipeline_id)
            if multi_worker:
                first = ctx.input_pipeline_id * local
                return self.worker_dataset(plan, range(first, first + local), start=start, epochs=epochs, rows=rows)
            return self.replica_dataset(plan, ctx.input_pipeline_id, start=start, epochs=epochs, rows=rows)

        # Prefetching onto the device (a MultiDeviceIterator per replica) pays off for GPUs. For
        # logical CPU devices, which share host memory, it only adds cost: measured, it made
        # iterator start-up 4x slower, steps ~10% slower, and deleting the iterator ~0.5 s slower.
        if multi_worker and epochs is None:
            raise ValueError("epochs must be an int for a multi-worker strategy (endless streams plan in Python "
                             "inside the pipeline; see replica_dataset); pass the number of epochs to read")
        autotune_off_on_devices()  # deleting a multi-device iterator must not wait up to a minute
        mode = tf.distribute.InputReplicationMode
        options = tf.distribute.InputOptions(
            experimental_replication_mode=mode.PER_WORKER if multi_worker else mode.PER_REPLICA,
            experimental_fetch_to_device=not on_cpu(strategy))
        return strategy.distribute_datasets_from_function(dataset_fn, options=options)
