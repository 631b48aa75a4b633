"""Refinement of a cost split: exchanges between the most and the least loaded replicas.

Each pass pairs the replicas of a step most loaded with least loaded, second with second,
..., keeps the pairs whose heavier replica is above the step's tolerance, and gives each
pair the one exchange of samples (or move of a sample into a free slot) that best evens
out its two loads per unit of weight. The best partner of each sample of the heavier
replica is one of the two samples of the lighter one nearest in cost to it minus the
ideal transfer, found for all samples of all pairs by one sort (O(m log m) per pair, not
the O(m^2) of trying every exchange). A step stops when a pass improves none of its pairs,
when its maximum is within the tolerance of its lower bound (``TOL``, looser below
``TOL_SAMPLES`` samples per replica), or, once within 1% of the bound, when a pass closes
less than a quarter of the remaining gap.

Layouts are ``[steps, R, slots]`` with each replica's real samples first (``fill`` of them).
"""
from __future__ import annotations

import numpy as np

__all__ = ["refine", "TOL"]

TOL = 1e-4  # a step whose maximum load is within this fraction of its lower bound is left as it is ...
TOL_SAMPLES = 64  # ... with this many samples per replica or more; with m < 64, within TOL * 64 / m
_CLOSE = 0.01  # within this fraction of its bound a step stops once a pass closes less than a quarter of its gap


def _pack(v: np.ndarray, tag, low) -> np.ndarray:
    """Non-negative floats as sortable int64 with ``tag`` in the low bits (a relative change below 1e-9)."""
    return (v.view(np.int64) & ~low) | tag


def _best_exchange(a, a_ok, b, la, lb, wa, wb):
    """Per pair: (new max, slot in a, slot in b) of the best exchange; a free slot of b (cost 0) is a move.

    Moving cost ``d = a_i - b_j`` from the heavier replica gives the pair a maximum of
    ``max((la - d) / wa, (lb + d) / wb)``, smallest at ``d* = (la wb - lb wa) / (wa + wb)``
    and growing on both sides, so for each ``a_i`` the best partner is one of the two
    samples of ``b`` nearest ``a_i - d*``: one sort of both rows finds them all.
    """
    p, m = a.shape
    low = np.int64((1 << _bits(2 * m - 1)) - 1)
    lane = np.arange(m)
    kb = _pack(b, lane, low)
    kb.sort(axis=1)
    b_val = (kb & ~low).view(np.float64)                                       # ascending
    dstar = np.maximum((la * wb - lb * wa) / (wa + wb), 0.0)[:, None]
    merged = np.concatenate((_pack(b_val + dstar, lane, low), _pack(np.where(a_ok, a, 1e300), m + lane, low)),
                            axis=1)
    merged.sort(axis=1)
    is_a = (merged & low) >= m
    ka = merged[is_a].reshape(p, m)
    below = np.nonzero(is_a)[1].reshape(p, m) - lane                           # samples of b with b + d* <= a
    a_val = (ka & ~low).view(np.float64)
    pad = np.empty((p, m + 2))
    pad[:, 0], pad[:, 1:-1], pad[:, -1] = -np.inf, b_val, np.inf
    at = (np.arange(p) * (m + 2))[:, None] + below
    pad = pad.ravel()
    # The nearest b at or below a - d* moves d >= d* (the lighter side sets the maximum), the one above moves less.
    new_lo = (lb[:, None] + a_val - pad[at]) / wb[:, None]
    new_hi = (la[:, None] - a_val + pad[at + 1]) / wa[:, None]
    up = new_hi < new_lo
    new = np.where(up, new_hi, new_lo)
    i = np.argmin(new, axis=1)
    rows = np.arange(p)
    j = below[rows, i] - 1 + up[rows, i]
    return new[rows, i], (ka[rows, i] & low) - m, kb[rows, j] & low


def _bits(x: int) -> int:
    return max(1, int(x).bit_length())


def _apply(o, c3, ld, fl, s, hi, lo, ia, jb):
    """Exchange slot ``ia`` of replica ``hi`` with slot ``jb`` of ``lo`` in steps ``s``; a free ``jb`` is a move."""
    move = jb >= fl[s, lo]
    ca, ida = c3[s, hi, ia], o[s, hi, ia]
    jb = np.where(move, fl[s, lo], jb)
    cb = np.where(move, 0.0, c3[s, lo, np.minimum(jb, o.shape[2] - 1)])
    idb = np.where(move, -1, o[s, lo, np.minimum(jb, o.shape[2] - 1)])
    o[s, lo, jb], c3[s, lo, jb] = ida, ca
    ld[s, hi] += cb - ca
    ld[s, lo] += ca - cb
    # An exchange puts b where a was; a move fills a's slot with hi's last sample, so real samples stay first.
    last = fl[s, hi] - 1
    fill_id = np.where(move, o[s, hi, last], idb)
    fill_c = np.where(move, c3[s, hi, last], cb)
    o[s, hi, ia], c3[s, hi, ia] = fill_id, fill_c
    mv = move.nonzero()[0]
    o[s[mv], hi[mv], last[mv]] = -1
    c3[s[mv], hi[mv], last[mv]] = 0.0
    fl[s[mv], hi[mv]] -= 1
    fl[s[mv], lo[mv]] += 1


def _pass(out, cost3, loads, fill, w, steps, thr) -> np.ndarray:
    """One pass of pairwise exchanges on ``steps``, in place; bool per step: which improved."""
    m = out.shape[2]
    key = loads[steps] / w[None, :]
    order = np.argsort(key, axis=1, kind="stable")
    pairs = w.shape[0] // 2
    hi, lo = order[:, ::-1][:, :pairs], order[:, :pairs]
    over = np.take_along_axis(key, hi, axis=1) > thr[:, None]
    pk, col = np.nonzero(over)
    ps, hi, lo = steps[pk], hi[pk, col], lo[pk, col]
    a_ok = np.arange(m)[None, :] < fill[ps, hi][:, None]
    la, lb, wa, wb = loads[ps, hi], loads[ps, lo], w[hi], w[lo]
    val, ia, jb = _best_exchange(cost3[ps, hi], a_ok, cost3[ps, lo], la, lb, wa, wb)
    better = val < (la / wa) * (1 - 1e-12)
    _apply(out, cost3, loads, fill, ps[better], hi[better], lo[better], ia[better], jb[better])
    improved = np.zeros(steps.size, dtype=bool)
    improved[pk[better]] = True
    return improved


def refine(out: np.ndarray, cost3: np.ndarray, loads: np.ndarray, fill: np.ndarray, w: np.ndarray,
           floor: np.ndarray, iterations: int) -> None:
    """Pairwise exchanges, in place, on the steps whose maximum is not within the tolerance of ``floor``."""
    s, r, m = out.shape
    if r < 2 or m == 0:
        return
    # Fewer samples per replica balance more coarsely, and their imbalance is mostly the lower
    # bound's own (one long sample), so they stop further from the bound.
    tol = TOL * max(1.0, TOL_SAMPLES * r / max(1, int(fill[0].sum())))
    thr = floor * (1 + tol)
    active = np.flatnonzero((loads / w[None, :]).max(axis=1) > thr)
    for _ in range(iterations):
        if active.size == 0:
            return
        before = (loads[active] / w[None, :]).max(axis=1)
        moved = _pass(out, cost3, loads, fill, w, active, thr[active])
        after = (loads[active] / w[None, :]).max(axis=1)
        # A step goes on while it is above tolerance and the pass lowered its maximum, by a quarter of
        # the gap or more once the step is within _CLOSE of its bound (later passes pay little there).
        f = floor[active]
        gain = before - after
        active = active[moved & (after > f * (1 + tol)) & (gain > f * TOL)
                        & ((gain > (before - f) / 4) | (after > f * (1 + _CLOSE)))]
