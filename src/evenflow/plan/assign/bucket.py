"""Bucketing, one window at a time: steps of similar cost, in a random order of steps.

The epoch's order (shuffled, or stratified) is cut into windows of ``bucket_window`` full
steps. Each window is sorted by cost (stable) and cut into steps of G samples; the steps of
the whole epoch are then shuffled (one permutation of the step numbers), and the samples of
each step are shuffled among themselves, keyed by the step's place in the epoch, so a
contiguous split does not hand replica 0 the cheapest samples.

A partial last step is a run of similar costs at a random place in the last window (not its
most costly samples, which would end the epoch on its slowest step); the rest of that window
stays sorted and is cut into full steps as usual. It stays the last step, so
``drop_remainder`` keeps meaning "the last one".

Any step needs only its own window sorted, so a window of steps costs time and memory in
proportion to the bucket windows it touches, never to N.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from evenflow.plan.parallel import cores, split_range
from evenflow.plan.shuffle import mix64
from evenflow.plan.stable_sort import stable_argsort_nonnegative

_PARALLEL_MIN = 1 << 18  # samples of a window from which its shuffle and cost reads are split across cores


class BucketedOrder:
    """The bucketed order of one epoch.

    Args:
        base: ``base(lo, hi)`` returns the samples at positions ``lo..hi-1`` of the order
            being bucketed (int64).
        costs: float ``[N]`` cost per sample (may be memory-mapped).
        g: global batch size; window_steps: steps per window; used: samples planned.
        rng: the epoch's bucketing generator (draws the tail's place and the order of steps).
        within_key: uint64 key of the in-step shuffle.
    """

    def __init__(self, base: Callable[[int, int], np.ndarray], costs: np.ndarray, g: int, window_steps: int,
                 used: int, rng: np.random.Generator, within_key: np.uint64):
        self._base, self._costs, self._g, self._key = base, costs, g, within_key
        self._window = g * window_steps
        self.num_full, self._rem = divmod(used, g)
        self._used = used
        self._last = (used - 1) // self._window * self._window if used else 0
        self._at = self._last + int(rng.integers(0, used - self._last - self._rem + 1)) if self._rem else 0
        self._step_perm = rng.permutation(self.num_full)
        self._kept: tuple = (-1, None)  # the last window sorted: the partial step reuses it

    def _sorted_window(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window w sorted by cost without the partial step's run, and that run (empty elsewhere)."""
        if self._kept[0] == w:
            return self._kept[1]
        self._kept = (w, self._sort(w))
        return self._kept[1]

    def _sort(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        lo = w * self._window
        hi = min(lo + self._window, self._used)
        ids, c = np.empty(hi - lo, np.int64), np.empty(hi - lo)

        def gather(a: int, b: int) -> None:  # the window's samples and their costs (a random read of the file)
            ids[a - lo:b - lo] = self._base(a, b)
            c[a - lo:b - lo] = self._costs[ids[a - lo:b - lo]]

        split_range(gather, lo, hi, cores() if hi - lo >= _PARALLEL_MIN else 1)
        ids = ids[stable_argsort_nonnegative(c)]  # np.argsort(kind="stable"), faster
        if not self._rem or lo != self._last:
            return ids, ids[:0]
        at = self._at - lo
        return np.concatenate((ids[:at], ids[at + self._rem:])), ids[at: at + self._rem]

    def steps(self, first: int, last: int) -> np.ndarray:
        """Samples of steps ``first..last-1`` in step order (int64, ``[bounds[last] - bounds[first]]``)."""
        g = self._g
        full_last = min(last, self.num_full)
        tail = self._rem if first <= self.num_full < last else 0
        size = max(full_last - first, 0) * g + tail
        out = np.empty(size, dtype=np.int64)
        lane = np.arange(g, dtype=np.int64)
        steps = np.arange(first, full_last, dtype=np.int64)
        sorted_step = self._step_perm[first:full_last]
        window_of = sorted_step * g // self._window
        for w in np.unique(window_of):
            ids, _ = self._sorted_window(int(w))
            pick = window_of == w
            s = steps[pick]
            rows = ids[(sorted_step[pick] * g - int(w) * self._window)[:, None] + lane[None, :]]
            keys = mix64((s[:, None] * g + lane[None, :]).astype(np.uint64), self._key)  # distinct: a bijection
            rows = np.take_along_axis(rows, argsort_distinct_rows(keys), axis=1)
            out[((s - first)[:, None] * g + lane[None, :]).ravel()] = rows.ravel()
        if tail:
            out[size - tail:] = self._sorted_window(self._last // self._window)[1]
        return out


def argsort_distinct_rows(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, axis=1)`` for uint64 rows whose keys are distinct, about 2x faster.

    Each key keeps its top bits, with its lane below them, and the rows are sorted as values
    (numpy's vectorised sort, where its argsort is not). Where two keys of a row share those top
    bits (about g^2 / 2^(65 - log2 g) per row of g: 3% of rows of 2^20, none of smaller ones in
    practice) lane order could differ from key order, so those rows are argsorted as before. With
    distinct keys every sorting order is the same permutation, so the result is exact.
    """
    k, g = keys.shape
    b = np.uint64(max(1, (g - 1).bit_length()))
    packed = keys >> b
    packed <<= b
    packed |= np.arange(g, dtype=np.uint64)
    packed.sort(axis=1)
    top = packed >> b
    clash = np.flatnonzero((top[:, 1:] == top[:, :-1]).any(axis=1))
    packed &= (np.uint64(1) << b) - np.uint64(1)
    order = packed.view(np.int64)
    if clash.size:
        order[clash] = np.argsort(keys[clash], axis=1)
    return order
