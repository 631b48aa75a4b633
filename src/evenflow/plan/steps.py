"""The global steps of an epoch, computed for any window without arrays over the whole epoch.

Every step holds G samples except the last, which holds what is left (or is dropped with
``drop_remainder``). So step s starts at ``min(s * G, used)``, and the rotation that deals
the leftover samples of step s (:mod:`evenflow.plan.assign.apportion`) starts at
``s * left_G mod R``, where ``left_G`` is what a full step leaves after the floors: every step
before s is full. A window of steps costs memory in proportion to the window, and a plan of
10^11 samples holds no per-step array at all.
"""
from __future__ import annotations

import math

import numpy as np

from evenflow.plan.assign.apportion import leftovers, split_counts


class StepGrid:
    """Steps of ``global_batch_size`` over ``num_samples``, the last one partial unless dropped."""

    def __init__(self, num_samples: int, global_batch_size: int, drop_remainder: bool):
        self.g = int(global_batch_size)
        self.num_full, rest = divmod(int(num_samples), self.g)
        self.rest = 0 if drop_remainder else rest
        self.used = self.num_full * self.g + self.rest
        self.num_steps = self.num_full + (1 if self.rest else 0)

    def start(self, step: int) -> int:
        """Where step ``step`` starts in the order (``used`` for ``step == num_steps``)."""
        return min(int(step) * self.g, self.used)

    def bounds(self, first: int = 0, last: int | None = None) -> np.ndarray:
        """int64 ``[last - first + 1]``: where steps ``first..last-1`` start in the order, then the end."""
        last = self.num_steps if last is None else last
        return np.minimum(np.arange(first, last + 1, dtype=np.int64) * self.g, self.used)

    def sizes(self, first: int = 0, last: int | None = None) -> np.ndarray:
        """int64 ``[last - first]``: samples in steps ``first..last-1``."""
        return np.diff(self.bounds(first, last))

    def counts(self, shares: np.ndarray, first: int = 0, last: int | None = None) -> np.ndarray:
        """int64 ``[last - first, R]``: real samples per replica (as ``apportion.replica_counts``)."""
        last = self.num_steps if last is None else last
        r = shares.shape[0]
        left = int(leftovers(np.asarray([self.g]), shares)[0])
        start = (np.arange(first, last, dtype=np.int64) * left) % r
        return split_counts(self.sizes(first, last), shares, start)

    def max_count(self, shares: np.ndarray) -> int:
        """The largest real count of any replica in any step (0 for no steps)."""
        if self.num_steps == 0:
            return 0
        r = shares.shape[0]
        left = int(leftovers(np.asarray([self.g]), shares)[0])
        # Full steps repeat their rotation every r / gcd(left, r) steps: one of each is enough.
        period = r // math.gcd(left, r) if left else 1
        full = np.arange(min(self.num_full, period), dtype=np.int64)
        sizes = np.full(full.shape[0], self.g, np.int64)
        start = (full * left) % r
        if self.rest:
            sizes = np.append(sizes, self.rest)
            start = np.append(start, (self.num_full * left) % r)
        return int(split_counts(sizes, shares, start).max())
