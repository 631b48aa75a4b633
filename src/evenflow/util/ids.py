"""Checked sample ids of a batch: integers within ``0..num_samples-1`` (the plan's -1 padding refused)."""
from __future__ import annotations

import numpy as np


def sample_ids(ids, num_samples: int) -> np.ndarray:
    """``ids`` as int64 ``[B]``, each checked to be a sample id in ``0..num_samples-1``.

    Raises:
        TypeError: ids that are not integers.
        IndexError: an id out of range (such as the plan's -1 padding).
    """
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"sample ids must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= num_samples):
        bad = int(arr[(arr < 0) | (arr >= num_samples)][0])
        raise IndexError(f"sample id {bad} is out of range: the dataset has ids 0..{num_samples - 1} "
                         f"(-1 padding must be masked out before reading)")
    return arr
