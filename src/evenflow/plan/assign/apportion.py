"""How many real samples each replica gets in each step: largest remainder by weight.

Replica r's quota in a step of n samples is ``n * w_r / sum(w)``; each replica
gets the floor of its quota and the leftover samples go to the largest
fractional parts. Ties (always the case with equal weights) are broken by a
rotation that starts where the previous step's extra samples stopped, so the
extras are dealt round-robin over the epoch and, with equal weights, epoch
totals differ by at most one.

The rotation of step s depends only on the steps before it through a running sum of
their leftovers, so any window of steps is computed without the rows before it.
"""
from __future__ import annotations

import numpy as np


def _parts(sizes: np.ndarray, shares: np.ndarray):
    quota = sizes[:, None] * shares[None, :]
    base = np.floor(quota + 1e-9).astype(np.int64)
    return base, np.round(quota - base, 9), sizes - base.sum(axis=1)


def leftovers(sizes: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Samples of each step left after every replica's floor (dealt by the rotation)."""
    # One row per distinct step size (an epoch has at most two: full steps and the last).
    distinct, where = np.unique(sizes, return_inverse=True)
    return _parts(distinct, shares)[2][where]


def split_counts(sizes: np.ndarray, shares: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Real samples per replica of steps of ``sizes`` whose rotations start at ``start``."""
    r = shares.shape[0]
    base, frac, left = _parts(sizes, shares)
    rotation = (np.arange(r)[None, :] - start[:, None]) % r
    # Rank replicas by (larger fraction first, then rotation); the first `left` get one more.
    rank_order = np.lexsort((rotation, -frac), axis=-1)
    rank = np.empty_like(rank_order)
    np.put_along_axis(rank, rank_order, np.arange(r)[None, :].repeat(sizes.shape[0], 0), axis=1)
    return base + (rank < left[:, None])


def replica_counts(step_sizes: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Real samples per replica in every step of an epoch.

    A window of steps alone: :meth:`evenflow.plan.steps.StepGrid.counts`.

    Args:
        step_sizes: int ``[S]``, real samples in each global step of the whole epoch.
        shares: float ``[R]``, each replica's fraction of the work, summing to 1.

    Returns:
        int64 ``[S, R]`` whose rows sum to ``step_sizes``.
    """
    sizes = np.asarray(step_sizes, dtype=np.int64)
    left = leftovers(sizes, shares)
    return split_counts(sizes, shares, (np.cumsum(left) - left) % shares.shape[0])
