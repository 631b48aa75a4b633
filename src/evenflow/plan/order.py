"""The global order of one epoch: which samples form global step s.

This is the world-size invariant half of planning. It depends on the index,
the seed, the epoch and the global batch size, never on the replicas, so a
job that changes its topology mid-epoch keeps the same global steps.

Three orderings compose:
* a seeded permutation (always);
* stratification: each class's samples are spread evenly through the epoch,
  so every prefix, and so every step, carries the dataset's label mix;
* bucketing: windows of ``bucket_window`` steps are sorted by cost, cut into
  steps, then the steps are shuffled, so a step holds samples of similar cost
  while the order of steps stays random.
"""
from __future__ import annotations

import numpy as np

__all__ = ["epoch_rng", "epoch_order", "step_bounds"]

# Separate random streams, so adding a new random choice never changes an old one.
_STREAM_ORDER, _STREAM_STRATIFY, _STREAM_BUCKET, _STREAM_WITHIN = 1, 2, 3, 4


def epoch_rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """A generator fixed by (seed, epoch, stream), identical in every process."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


def step_bounds(num_samples: int, global_batch_size: int, drop_remainder: bool) -> np.ndarray:
    """Start offsets of the global steps in the epoch order, plus the end.

    Returns:
        int64 array of shape ``[num_steps + 1]``; step s is ``order[b[s]:b[s+1]]``.
    """
    full, rest = divmod(num_samples, global_batch_size)
    ends = list(range(0, full * global_batch_size + 1, global_batch_size))
    if rest and not drop_remainder:
        ends.append(num_samples)
    return np.asarray(ends, dtype=np.int64)


def _stratified(codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # Each class's members, in random order, sit at evenly spaced positions
    # (k + 0.5) / n_c of the epoch; merging the classes by position gives an
    # order whose every window holds each class in proportion. Random ties.
    n = codes.shape[0]
    perm = rng.permutation(n)
    by_class = perm[np.argsort(codes[perm], kind="stable")]
    counts = np.bincount(codes)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    cls = codes[by_class]
    rank = np.arange(n) - starts[cls]
    position = (rank + 0.5) / counts[cls]
    tiebreak = rng.random(n)
    return by_class[np.lexsort((tiebreak, position))]


def _bucketed(order: np.ndarray, costs: np.ndarray, g: int, window_steps: int,
              bounds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    used = int(bounds[-1])
    order = order[:used]
    window = g * window_steps
    window_id = np.arange(used) // window
    order = order[np.lexsort((costs[order], window_id))]
    num_full = used // g
    # Shuffle the full steps; a partial step stays last, so drop_remainder keeps meaning "the last one".
    step_perm = rng.permutation(num_full)
    full = order[: num_full * g].reshape(num_full, g)[step_perm]
    # Shuffle inside each step so a contiguous split does not hand replica 0 the shortest samples.
    full = np.take_along_axis(full, np.argsort(rng.random(full.shape), axis=1), axis=1)
    tail = order[num_full * g:]
    tail = tail[rng.permutation(tail.shape[0])]
    return np.concatenate((full.ravel(), tail))


def epoch_order(index, options, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of an epoch in global-step order.

    Returns:
        ``(order, bounds)``: ``order`` is int64 ``[n_used]`` (all N ids, or fewer with
        ``drop_remainder``); ``bounds`` is int64 ``[num_steps + 1]`` as in :func:`step_bounds`.
    """
    n, g = index.num_samples, options.global_batch_size
    bounds = step_bounds(n, g, options.drop_remainder)
    if options.stratify:
        order = _stratified(index.label_codes, epoch_rng(options.seed, epoch, _STREAM_STRATIFY))
    else:
        order = epoch_rng(options.seed, epoch, _STREAM_ORDER).permutation(n).astype(np.int64)
    if options.bucket:
        order = _bucketed(order, index.costs, g, options.bucket_window, bounds,
                          epoch_rng(options.seed, epoch, _STREAM_BUCKET))
    return order[: int(bounds[-1])], bounds
