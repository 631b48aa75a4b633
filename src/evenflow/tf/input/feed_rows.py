"""The ``tf.data`` rows of a :class:`~evenflow.plan.feed.PlanFeed`: one element per step, asked for in blocks.

A pipeline asks the feed for the rows of up to :data:`FEED_BLOCK` steps per Python call; the
feed may serve fewer (it bounds how far a pipeline reads ahead of a consumer that reports its
step, see :meth:`~evenflow.plan.feed.PlanFeed.advance`), and the next call starts after the
last step served. The position lives in the dataset's own ``scan`` state, so every iterator of
the dataset reads from the feed's first step. Rows of steps under different plans may differ in
width: the leading axis of the ids is dynamic.
"""
from __future__ import annotations

from evenflow.plan.feed import PlanFeed
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import numpy_function

# Steps per call into a plan feed, at most: each call costs ~0.2 ms of CPU and the GIL (measured
# with 4 replica pipelines of 16-sample rows).
FEED_BLOCK = 4


def feed_rows(feed: PlanFeed, replicas: int | range):
    """Row dicts (``id``, ``global_real_count``, ``epoch``) of one replica, or of a worker's ``replicas``
    (then each element holds the rows of all of them, ``id`` ``[len, slots]``), one per step."""
    tf = _tf()
    shape = [None, None] if isinstance(replicas, int) else [None, len(replicas), None]

    def next_block(g, _):
        ids, counts, epoch = numpy_function(lambda x: feed.rows_block(int(x), FEED_BLOCK, replicas), [g],
                                            [tf.int64, tf.int64, tf.int64], stateful=True)
        block = {"id": tf.ensure_shape(ids, shape), "global_real_count": tf.ensure_shape(counts, shape[:-1]),
                 "epoch": tf.ensure_shape(epoch, shape[:-1])}
        return g + tf.shape(counts, out_type=tf.int64)[0], block

    # One tick per step at most (a block has one step or more; an empty one ends the stream).
    return (tf.data.Dataset.range(feed.first, feed.end)
            .scan(tf.constant(feed.first, tf.int64), next_block)
            .take_while(lambda block: tf.shape(block["global_real_count"])[0] > 0)
            .flat_map(tf.data.Dataset.from_tensor_slices))
