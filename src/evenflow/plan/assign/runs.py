"""The contiguous-runs split of a cost-sorted step (cost balancing with bucketing).

Replica r takes the r-th run of the step's samples in cost order, cut where the running
cost reaches its cumulative share of the step's total (by weight), nearer of the two
samples around each target. Neighbours in cost order share a batch, so padding each batch
to its longest sample wastes little. Every run holds at most ``slots`` samples, and at
least one when the step has a sample per replica.
"""
from __future__ import annotations

import numpy as np


def runs_split(sid: np.ndarray, c: np.ndarray, w: np.ndarray, slots: int):
    """Contiguous runs of cost-sorted steps ``sid``/``c`` ``[s, n]``, one per replica, by cost share.

    Returns ``[s, R, slots]`` ids (-1 free) and costs, loads ``[s, R]`` and filled slots ``[s, R]``.
    """
    s, n = sid.shape
    r = w.shape[0]
    prefix = np.cumsum(c, axis=1)
    total = prefix[:, -1]
    target = total[:, None] * (np.cumsum(w)[:-1] / w.sum())[None, :]          # [s, r-1]
    # Rows laid end to end stay sorted, so one searchsorted finds every cut.
    shift = (np.arange(s) * (float(total.max()) * 2 + 1.0))[:, None]
    cut = np.searchsorted((prefix + shift).ravel(), (target + shift).ravel(), side="right").reshape(s, r - 1)
    cut -= np.arange(s)[:, None] * n
    # Take the next sample too when that lands nearer the target than stopping before it.
    before = np.where(cut > 0, np.take_along_axis(prefix, np.maximum(cut - 1, 0), axis=1), 0.0)
    after = np.take_along_axis(prefix, np.minimum(cut, n - 1), axis=1)
    cut = cut + ((cut < n) & (after - target < target - before))
    cuts = np.concatenate((np.zeros((s, 1), np.int64), cut, np.full((s, 1), n, np.int64)), axis=1)
    _clip_cuts(cuts, n, slots, 1 if n >= r else 0)  # every replica gets a sample when there are enough
    counts = np.diff(cuts, axis=1)
    fill = np.arange(slots)[None, None, :] < counts[:, :, None]
    out = np.full((s, r, slots), -1, dtype=np.int64)
    cost3 = np.zeros((s, r, slots))
    out[fill] = sid.ravel()  # C order of the mask is the order of the runs
    cost3[fill] = c.ravel()
    return out, cost3, cost3.sum(axis=2), counts


def _clip_cuts(cuts: np.ndarray, n: int, slots: int, one: int) -> None:
    """Clip, in place and left to right, the cuts so every run holds ``one`` to ``slots`` samples.

    Cut j's bounds depend on the clipped cut j - 1. All cuts are first tried against their
    predecessors as they stand: up to the first cut that this moves, the sequential pass would
    change nothing, so it runs only from there (usually from nowhere).
    """
    r = cuts.shape[1] - 1
    rest = r - np.arange(1, r)  # replicas after cut j
    low = np.maximum(cuts[:, :-2] + one, n - slots * rest)
    high = np.minimum(cuts[:, :-2] + slots, n - one * rest)
    moved = np.flatnonzero(((cuts[:, 1:-1] < low) | (cuts[:, 1:-1] > high)).any(axis=0))
    for j in range(int(moved[0]) + 1 if moved.size else r, r):
        low = np.maximum(cuts[:, j - 1] + one, n - slots * (r - j))
        high = np.minimum(cuts[:, j - 1] + slots, n - one * (r - j))
        cuts[:, j] = np.clip(cuts[:, j], low, high)
