"""Count balancing: each replica takes a contiguous run of its step's (random) order.

Because the global order is already random, a contiguous split is a random
split; it costs a few vectorised passes over the epoch and no Python loop.
"""
from __future__ import annotations

import numpy as np


def assign_contiguous(order: np.ndarray, bounds: np.ndarray, counts: np.ndarray, slots: int) -> np.ndarray:
    """Lay out ``order`` so that step s gives ``counts[s, r]`` consecutive samples to replica r.

    Args:
        order: int64 ``[bounds[-1] - bounds[0]]`` sample ids in step order.
        bounds: int64 ``[S + 1]`` step offsets into ``order`` (may start above 0).
        counts: int ``[S, R]``; row s sums to ``bounds[s+1] - bounds[s]``.
        slots: width of the slot axis, at least ``counts.max()``.

    Returns:
        int64 ``[S, R, slots]`` with -1 where a replica has no sample.
    """
    s, r = counts.shape
    ids = np.full((s, r, slots), -1, dtype=np.int64)
    # A boolean mask in C order visits (step, replica, slot) exactly in the order `order` is
    # laid out, so one masked assignment fills every cell without index temporaries.
    ids[np.arange(slots)[None, None, :] < counts[:, :, None]] = order
    return ids

