"""Splitting a step by replica speeds: what a split gains, how uneven it is, weights every replica can run.

Framework-free helpers of :class:`~evenflow.plan.speed.rebalancer.Rebalancer`: replica ``r`` needs ``u_r``
seconds per unit of load, so under shares ``p`` (summing to 1) of a step's load ``L`` it takes
``L * p_r * u_r``, and the step takes the slowest of those.
"""
from __future__ import annotations

import numpy as np


def gain(shares: np.ndarray, seconds_per_unit: np.ndarray) -> float:
    """How many times faster a step would be under the best shares than under ``shares``."""
    u = np.asarray(seconds_per_unit, np.float64)
    return float(np.max(np.asarray(shares, np.float64) * u) * np.sum(1.0 / u))


def step_imbalance(shares: np.ndarray, seconds_per_unit: np.ndarray) -> float:
    """Predicted max over replicas of their step time / the mean step time."""
    t = np.asarray(shares, np.float64) * np.asarray(seconds_per_unit, np.float64)
    return float(t.max() / t.mean())


def feasible_weights(weights: np.ndarray, global_batch_size: int) -> np.ndarray:
    """Raise the smallest weights so that every replica's share of a full step is >= 1.5 samples.

    A plan gives a replica whose share rounds to zero an all-padding row, which measures
    nothing: a replica measured as very slow still gets a little work, and so keeps being measured.
    """
    w = np.asarray(weights, np.float64).copy()
    floor = min(1.5 / global_batch_size, 1.0 / len(w))
    for _ in range(8):  # raising one weight lowers the others' shares a little: converges in a few rounds
        share = w / w.sum()
        low = share < floor
        if not low.any():
            break
        w[low] = floor * w[~low].sum() / (1 - floor * low.sum()) if (~low).any() else w[low]
    return w
