"""The global order of one epoch: which samples form global step s.

This is the world-size invariant half of planning. It depends on the index,
the seed, the epoch and the global batch size, never on the replicas, so a
job that changes its topology mid-epoch keeps the same global steps.

Three orderings compose:
* a seeded permutation (always): :class:`~evenflow.plan.shuffle.EpochShuffle`, random access,
  so a window of steps is planned without the rest of the epoch;
* stratification: each step's class counts are apportioned from the dataset's
  mix, carrying rounding debts forward, so every prefix of steps is within one
  sample per class of the dataset's mix and every step within two;
* bucketing (:mod:`evenflow.plan.assign.bucket`): windows of ``bucket_window`` steps are
  sorted by cost, cut into steps, then the steps are shuffled, so a step holds samples
  of similar cost while the order of steps stays random.

Stratification apportions each class over the whole epoch, so a stratified order is
built whole (O(N)) and then read like the others.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.assign.bucket import BucketedOrder
from evenflow.plan.shuffle import EpochShuffle, stream_keys

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


def _class_counts_per_step(sizes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    # Running apportionment: each step's class counts are its quota n_s * p_c plus what
    # earlier steps still owe the class, rounded by largest remainder. The owed amount
    # stays in (-1, 1), so every prefix of steps is within one sample of the dataset's
    # mix per class and every step within two.
    p = totals / totals.sum()
    left = totals.astype(np.int64).copy()
    owed = np.zeros(p.shape[0])
    out = np.zeros((sizes.shape[0], p.shape[0]), dtype=np.int64)
    for s, n in enumerate(sizes):
        want = n * p + owed
        x = np.minimum(np.maximum(np.floor(want + 1e-9), 0).astype(np.int64), left)
        short = int(n - x.sum())
        if short > 0:
            room = left - x
            order = np.lexsort((np.arange(p.shape[0]), -(want - x)))
            order = order[room[order] > 0]
            give = np.zeros_like(x)
            while short > 0:  # normally one pass; more only when classes run out
                take = order[room[order] > give[order]][:short]
                if take.shape[0] == 0:
                    raise RuntimeError("stratified step apportionment ran out of samples; this is a bug in evenflow")
                give[take] += 1
                short -= take.shape[0]
            x += give
        elif short < 0:
            # The 1e-9 guard on floor() can round a few classes up and overshoot n by a sample
            # or two; take them back from the classes given most beyond their quota.
            order = np.lexsort((np.arange(p.shape[0]), want - x))
            order = order[x[order] > 0][:-short]
            x[order] -= 1
        out[s] = x
        left -= x
        owed = want - x
    return out


def _stratified(codes: np.ndarray, bounds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = codes.shape[0]
    totals = np.bincount(codes)
    sizes = np.diff(bounds)
    per_step = _class_counts_per_step(sizes, totals)          # [S, C]
    used = per_step.sum(axis=0)
    perm = rng.permutation(n)
    by_class = perm[np.argsort(codes[perm], kind="stable")]  # each class's members, in random order
    starts = np.concatenate(([0], np.cumsum(totals)[:-1]))
    # The first used[c] members of class c go to steps in order, per_step[s, c] to step s.
    take = np.concatenate([by_class[starts[c]: starts[c] + used[c]] for c in range(totals.shape[0])])
    step_of = np.concatenate([np.repeat(np.arange(sizes.shape[0]), per_step[:, c]) for c in range(totals.shape[0])])
    order = take[np.lexsort((rng.random(take.shape[0]), step_of))]
    if int(bounds[-1]) < n:  # drop_remainder: the unused members follow, never planned
        rest = np.setdiff1d(perm, order, assume_unique=True)
        order = np.concatenate((order, rest))
    return order


class EpochOrder:
    """The samples of one epoch in global-step order, read a window of steps at a time.

    ``steps(first, last)`` equals the same slice of the whole epoch's order, whatever the
    window; ``at(positions)`` reads single positions (orders that are neither stratified
    nor bucketed only: there a position's sample does not depend on any other).

    Attributes:
        grid: the epoch's :class:`~evenflow.plan.steps.StepGrid`.
        random_access: whether ``at`` is available.
    """

    def __init__(self, index, options, epoch: int, grid):
        n, g = index.num_samples, options.global_batch_size
        self.grid = grid
        self.random_access = not (options.stratify or options.bucket)
        self.kept = None  # what a window of this epoch may keep for the next (a stratified split)
        if options.stratify:
            whole = _stratified(index.label_codes, grid.bounds(), epoch_rng(options.seed, epoch, _STREAM_STRATIFY))
            self._at, self._range = whole.__getitem__, lambda lo, hi: whole[lo:hi]
        else:
            shuffle = EpochShuffle(n, options.seed, epoch, _STREAM_ORDER)
            self._at, self._range = shuffle, shuffle.range
        self._bucketed = None
        if options.bucket:
            self._bucketed = BucketedOrder(self._range, index.costs, g, options.bucket_window, grid.used,
                                           epoch_rng(options.seed, epoch, _STREAM_BUCKET),
                                           stream_keys(options.seed, epoch, _STREAM_WITHIN, 1)[0])

    def steps(self, first: int, last: int) -> np.ndarray:
        """Samples of steps ``first..last-1``, int64 ``[bounds[last] - bounds[first]]``."""
        if self._bucketed is not None:
            return self._bucketed.steps(first, last)
        return self._range(self.grid.start(first), self.grid.start(last))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Samples at ``positions`` of the order (int64, same shape)."""
        if not self.random_access:
            raise ValueError("a stratified or bucketed order is read by steps, not by positions")
        return self._at(positions)
