"""The ``tf.data`` pipeline that turns rows of a plan into batches.

Each element of the input is one row of the plan (``id``, ``global_real_count``,
``epoch``; see :class:`~evenflow.plan.epoch_rows.EpochRows`). :func:`load_batches` loads
the row's samples from the source in one vectorised call, masks the padding slots,
applies the map functions, optionally stamps when each batch was produced, and prefetches.
"""
from __future__ import annotations

from typing import Callable, Sequence

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.chain_fns import checked_batch_fn
from evenflow.tf.input.pyfunc import numpy_function, wall_clock
from evenflow.data.source import RESERVED_KEYS
from evenflow.tf.input.sources import TensorSource

MapFn = Callable[[dict], dict]


def load_batches(rows_ds, source: TensorSource, map_fns: Sequence[MapFn], *, trim_padding: bool, stamp: bool,
                 prefetch: int):
    """The batches of a dataset of plan rows.

    Args:
        rows_ds: a ``tf.data.Dataset`` of row dicts: ``id`` int64 ``[slots]`` (-1 for
            padding), ``global_real_count`` and ``epoch`` int64 scalars.
        source: a TensorFlow :class:`~evenflow.tf.input.sources.TensorSource`.
        map_fns: functions ``batch -> batch`` applied in order, each with
            ``num_parallel_calls=AUTOTUNE``.
        trim_padding: drop the padding slots of each row (keeping at least one).
        stamp: add ``produced``, the host clock when the batch left the last map function.
        prefetch: batches to prefetch.

    Returns:
        A ``tf.data.Dataset`` of batch dicts (see :mod:`evenflow.tf.input.reader`).
    """
    tf = _tf()
    ds = rows_ds.map(_row_loader(source, trim_padding, bool(map_fns)), num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True)
    for i, fn in enumerate(map_fns):
        ds = ds.map(checked_batch_fn(fn, f"map_fns[{i}]", last=i == len(map_fns) - 1),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return finish(ds, stamp=stamp, prefetch=prefetch)


def finish(ds, *, stamp: bool, prefetch: int):
    """``ds`` stamped (optionally) and prefetched, with tf.data's autotuner off (see below)."""
    tf = _tf()
    if stamp:
        ds = ds.map(_stamp)
    ds = ds.prefetch(prefetch)
    # tf.data's autotuner runs a model thread per iterator that sleeps on a growing timer
    # (up to a minute); deleting the iterator waits for it while holding the GIL. With R
    # replica pipelines that froze the end of a training run for 15 s to over 3 minutes
    # (measured). Without it, AUTOTUNE map parallelism falls back to
    # the size of tf.data's thread pool, and prefetching uses the fixed buffer above.
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def _row_loader(source: TensorSource, trim: bool, has_map_fns: bool) -> MapFn:
    """The map function that loads one row's samples from ``source`` and adds the reserved keys."""
    tf = _tf()

    def load(row):
        ids = row["id"]
        if trim:
            # Real slots first (stable, so their order is the plan's), then cut to max(real, 1).
            keep = tf.maximum(tf.reduce_sum(tf.cast(ids >= 0, tf.int32)), 1)
            ids = tf.gather(ids, tf.argsort(tf.cast(ids < 0, tf.int32), stable=True)[:keep])
        real = ids >= 0
        # A padding slot repeats the largest id of its own batch: a real neighbour, so a
        # cost-bucketed batch is not padded with an unusually long sample (0 if all padding).
        dummy = tf.maximum(tf.reduce_max(ids), 0)
        batch = dict(source.batch(tf.where(real, ids, dummy)))
        clash = [k for k in RESERVED_KEYS if k in batch]
        # 'features' may also come from a map function (e.g. images decoded in a stage of their own).
        missing = [k for k in ("features", "label") if k not in batch and (k == "label" or not has_map_fns)]
        if clash or missing:
            raise ValueError(f"source.batch must return 'features' (or leave it to a map function) and 'label' "
                             f"and none of the reserved keys {RESERVED_KEYS}; missing {missing}, reserved keys "
                             f"returned {clash}")
        batch.update(id=ids, mask=tf.cast(real, tf.float32), global_real_count=row["global_real_count"],
                     epoch=row["epoch"])
        return batch

    return load


def _stamp(batch: dict) -> dict:
    """``batch`` with ``produced``: the host clock (``time.time()``) now."""
    tf = _tf()
    now = numpy_function(wall_clock, [], tf.float64, stateful=True)
    return {**batch, "produced": tf.ensure_shape(now, [])}
