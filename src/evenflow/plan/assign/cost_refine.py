"""Refinement of a cost split: exchanges between the most and the least loaded replicas.

Each pass pairs the replicas of a step most loaded with least loaded, second with second,
..., keeps the pairs whose heavier replica is above the step's tolerance, and gives each
pair the one exchange of samples (or move of a sample into a free slot) that best evens
out its two loads per unit of weight. With up to ``BRUTE_MAX`` slots every exchange of every
pair is rated at once (``[pairs, m, m]``); with more, the best partner of each sample of the
heavier replica is one of the two samples of the lighter one nearest in cost to it minus the
ideal transfer, found for all samples of all pairs by one sort (O(m log m) per pair). Pairs are
rated in cache-sized blocks (2x faster than all at once on 2,048 pairs of 320 slots, measured),
shared among threads when the caller has cores to spare. A step stops when a pass improves none of its pairs,
when its maximum is within the tolerance of its lower bound (``TOL``, looser below
``TOL_SAMPLES`` samples per replica), or, once within 1% of the bound, when a pass closes
less than a quarter of the remaining gap.

Layouts are ``[steps, R, slots]`` with each replica's real samples first (``fill`` of them).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

TOL = 1e-4  # a step whose maximum load is within this fraction of its lower bound is left as it is ...
TOL_SAMPLES = 256  # ... with this many samples per replica or more; with m < 256, within TOL * 256 / m
BRUTE_MAX = 16  # up to this many slots, a pair's best exchange is found among all m x m, above it by a sort
_BLOCK_BYTES = 1 << 18  # per temporary of the m x m rating: blocks this small stay in cache and reuse freed memory
_SORT_BLOCK_BYTES = 1 << 20  # per temporary of the rating by sort (measured best of 2**18 to 2**21)
_THREAD_MIN = 1 << 17  # slots of all pairs of a pass below which one thread does the whole pass
_CLOSE = 0.01  # within this fraction of its bound a step stops once a pass closes less than a quarter of its gap
_NARROW = 12  # rows up to this wide (and at least _TALL of them) are reduced column by column ...
_TALL = 128  # ... because numpy's max along a short axis pays about 0.06-0.09 us per row


def row_max(a: np.ndarray) -> np.ndarray:
    """Each row's maximum of a 2-d array: ``a.max(axis=1)`` (the same values, but for the sign of a zero).

    For a few columns and many rows a loop over the columns is faster (measured: 21 against 135 us
    for 1,562 rows of 8, 108 against 620 us for 12,500 rows of 10), because numpy's reduction
    along a short axis costs per row.
    """
    rows, cols = a.shape
    if cols > _NARROW or cols < 2 or rows < _TALL:
        return a.max(axis=1)
    out = a[:, 0].copy()
    for j in range(1, cols):
        np.maximum(out, a[:, j], out=out)
    return out


def _pack(v: np.ndarray, tag, low, out=None) -> np.ndarray:
    """Non-negative floats as sortable int64 with ``tag`` in the low bits (a relative change below 1e-9)."""
    out = np.bitwise_and(v.view(np.int64), ~low, out=out)
    return np.bitwise_or(out, tag, out=out)


def _best_exchange(rows, lane_a, lane_b, la, lb, wa, wb, equal: bool, workers=None):
    """Per pair: (new max, slot in a, slot in b) of the best exchange; a free slot of b (cost 0) is a move.

    Pair k exchanges between ``a = rows[lane_a[k]]`` and ``b = rows[lane_b[k]]``. Moving cost
    ``d = a_i - b_j`` from the heavier replica gives the pair a maximum of
    ``max((la - d) / wa, (lb + d) / wb)``, smallest at ``d* = (la wb - lb wa) / (wa + wb)``
    and growing on both sides. A free slot of ``a`` (cost 0) moves ``d <= 0``, which never
    lowers the heavier side, so it is never chosen over an exchange that helps.

    Pairs go in blocks of about ``_BLOCK_BYTES`` (all pairs) or ``_SORT_BLOCK_BYTES`` (by sort) per
    temporary: small blocks stay in the cache and reuse the allocator's memory, where one temporary
    over all pairs costs a fresh page per 4 KiB.
    With ``workers`` (a thread pool and its size; used from ``_THREAD_MIN`` slots in all) the blocks
    are shared among its threads: numpy releases the GIL in its loops, and every pair's answer is its own.
    """
    p, m = lane_a.shape[0], rows.shape[1]
    dstar = np.maximum((la * wb - lb * wa) / (wa + wb), 0.0)
    if m <= BRUTE_MAX:
        step = max(1, _BLOCK_BYTES // (8 * m * m))
    else:
        step = max(1, _SORT_BLOCK_BYTES // (16 * m))
    d, ia, jb = np.empty(p), np.empty(p, np.int64), np.empty(p, np.int64)

    def blocks(lo: int, hi: int) -> None:
        for b0 in range(lo, hi, step):
            k = slice(b0, min(hi, b0 + step))
            a, b = np.take(rows, lane_a[k], axis=0), np.take(rows, lane_b[k], axis=0)
            if m <= BRUTE_MAX:
                i, j = _nearest_every_pair(a, b, wa[k], wb[k], dstar[k], equal)
            else:
                i, j = _nearest_by_sort(a, b, wa[k], wb[k], dstar[k])
            at = np.arange(i.shape[0])
            ia[k], jb[k], d[k] = i, j, a[at, i] - b[at, j]

    parts = 1 if workers is None or p * m < _THREAD_MIN else min(workers[1], -(-p // step))
    if parts == 1:
        blocks(0, p)
    else:
        cuts = [-(-p * t // parts) // step * step for t in range(parts)] + [p]
        list(workers[0].map(blocks, cuts[:-1], cuts[1:]))
    return np.maximum((la - d) / wa, (lb + d) / wb), ia, jb


def _nearest_every_pair(a, b, wa, wb, dstar, equal: bool):
    """Every (i, j) of each pair at once: ``[p, m, m]``, cheaper than sorting for a few slots.

    ``equal``: whether all replicas weigh the same (then the rating is ``|x|``).
    """
    p, m = a.shape
    x = (a - dstar[:, None])[:, :, None] - b[:, None, :]  # x = a_i - d* - b_j: the maximum grows by -x / wa below 0, x / wb above
    if equal:
        np.abs(x, out=x)
    else:
        y = x * (-1.0 / wa)[:, None, None]
        x *= (1.0 / wb)[:, None, None]
        np.maximum(x, y, out=x)
    k = np.argmin(x.reshape(p, m * m), axis=1)
    return k // m, k % m


def _nearest_by_sort(a, b, wa, wb, dstar):
    """For each ``a_i`` the two samples of ``b`` nearest ``a_i - d*``, by one sort of both rows (O(m log m))."""
    p, m = a.shape
    low = np.int64((1 << _bits(2 * m - 1)) - 1)
    lane = np.arange(m)
    kb = _pack(b, lane, low)
    kb.sort(axis=1)
    b_val = (kb & ~low).view(np.float64)                                       # ascending
    merged = np.empty((p, 2 * m), np.int64)
    _pack(b_val + dstar[:, None], lane, low, out=merged[:, :m])
    _pack(a, m + lane, low, out=merged[:, m:])
    merged.sort(axis=1)
    at_a = np.flatnonzero((merged & low) >= m)                                 # m per row, in row order
    ka = merged.ravel()[at_a].reshape(p, m)
    below = at_a.reshape(p, m) - (np.arange(p) * (2 * m))[:, None] - lane      # samples of b with b + d* <= a
    a_val = (ka & ~low).view(np.float64)
    pad = np.empty((p, m + 2))
    pad[:, 0], pad[:, 1:-1], pad[:, -1] = -np.inf, b_val, np.inf
    at = (np.arange(p) * (m + 2))[:, None] + below
    pad = pad.ravel()
    # The nearest b at or below a - d* moves d >= d* (the maximum grows by (d - d*) / wb), the one
    # above moves less (it grows by (d* - d) / wa); the caller rates the winner exactly.
    grow_lo = (a_val - pad[at] - dstar[:, None]) / wb[:, None]
    grow_hi = (dstar[:, None] - a_val + pad[at + 1]) / wa[:, None]
    up = grow_hi < grow_lo
    i = np.argmin(np.where(up, grow_hi, grow_lo), axis=1)
    rows = np.arange(p)
    j = below[rows, i] - 1 + up[rows, i]
    return (ka[rows, i] & low) - m, kb[rows, j] & low


def _bits(x: int) -> int:
    return max(1, int(x).bit_length())


def _apply(o, c3, ld, fl, lane_a, lane_b, ia, jb):
    """Exchange slot ``ia`` of row ``lane_a`` (a step's replica) with slot ``jb`` of row ``lane_b``.

    A free ``jb`` is a move. Each row appears at most once, so the fancy-indexed updates do not collide.
    """
    m = o.shape[2]
    of, cf, lf, ff = o.reshape(-1), c3.reshape(-1), ld.reshape(-1), fl.reshape(-1)
    fa, fb = ff[lane_a], ff[lane_b]
    move = jb >= fb
    at_a = lane_a * m + ia
    at_b = lane_b * m + np.where(move, fb, jb)  # a move fills b's first free slot (id -1, cost 0)
    ca, ida, cb, idb = cf[at_a], of[at_a], cf[at_b], of[at_b]
    of[at_b], cf[at_b] = ida, ca
    lf[lane_a] += cb - ca
    lf[lane_b] += ca - cb
    # An exchange puts b where a was; a move fills a's slot with a's last sample, so real samples stay first.
    last = lane_a * m + fa - 1
    of[at_a] = np.where(move, of[last], idb)
    cf[at_a] = np.where(move, cf[last], cb)
    gone = last[move]
    of[gone], cf[gone] = -1, 0.0
    ff[lane_a[move]] -= 1
    ff[lane_b[move]] += 1


def _pass(out, cost3, loads, fill, w, steps, thr, workers) -> np.ndarray:
    """One pass of pairwise exchanges on ``steps``, in place; bool per step: which improved."""
    r, m = out.shape[1], out.shape[2]
    key = loads[steps] / w[None, :]
    # The bits of floats >= 0 order as the floats do, and int64 sorts faster; exchanges can leave a
    # load a rounding error below 0, and then the floats themselves are sorted.
    bits = key.view(np.int64)
    order = np.argsort(bits if bits.min(initial=0) >= 0 else key, axis=1, kind="stable")
    pairs = r // 2
    hi, lo = order[:, ::-1][:, :pairs], order[:, :pairs]
    over = key.ravel()[hi + (np.arange(steps.size) * r)[:, None]] > thr[:, None]
    pk, col = np.nonzero(over)
    ps, hi, lo = steps[pk], hi[pk, col], lo[pk, col]
    lane_a, lane_b = ps * r + hi, ps * r + lo      # rows of the [steps * R, slots] views
    flat_loads, rows = loads.reshape(-1), cost3.reshape(-1, m)
    la, lb, wa, wb = flat_loads[lane_a], flat_loads[lane_b], w[hi], w[lo]
    equal = bool(np.all(w == w[0]))  # of all replicas: the rating never depends on which pairs are rated together
    val, ia, jb = _best_exchange(rows, lane_a, lane_b, la, lb, wa, wb, equal, workers)
    better = val < (la / wa) * (1 - 1e-12)
    _apply(out, cost3, loads, fill, lane_a[better], lane_b[better], ia[better], jb[better])
    improved = np.zeros(steps.size, dtype=bool)
    improved[pk[better]] = True
    return improved


def refine(out: np.ndarray, cost3: np.ndarray, loads: np.ndarray, fill: np.ndarray, w: np.ndarray,
           floor: np.ndarray, iterations: int, count: np.ndarray, threads: int = 1) -> None:
    """Pairwise exchanges, in place, on the steps whose maximum is not within the tolerance of ``floor``.

    ``count[i]`` is step i's number of samples. With ``threads > 1`` each pass's pairs are rated
    on that many threads (the result does not depend on it).
    """
    s, r, m = out.shape
    if r < 2 or m == 0:
        return
    # Exchanges move whole samples, so fewer samples per replica balance more coarsely: below
    # TOL_SAMPLES a step stops within about a fortieth of a mean sample of its bound.
    tol = TOL * np.maximum(1.0, TOL_SAMPLES * r / np.maximum(1, count))
    thr = floor * (1 + tol)
    active = np.flatnonzero(row_max(loads / w[None, :]) > thr)
    if threads > 1 and active.size * (r // 2) * m >= _THREAD_MIN:
        with ThreadPoolExecutor(threads) as pool:
            _passes(out, cost3, loads, fill, w, floor, tol, thr, active, iterations, (pool, threads))
    else:
        _passes(out, cost3, loads, fill, w, floor, tol, thr, active, iterations, None)


def _passes(out, cost3, loads, fill, w, floor, tol, thr, active, iterations: int, workers) -> None:
    before = row_max(loads[active] / w[None, :])
    for _ in range(iterations):
        if active.size == 0:
            return
        moved = _pass(out, cost3, loads, fill, w, active, thr[active], workers)
        after = row_max(loads[active] / w[None, :])
        # A step goes on while it is above tolerance and the pass lowered its maximum, by a quarter of
        # the gap or more once the step is within _CLOSE of its bound (later passes pay little there).
        f = floor[active]
        gain = before - after
        go = (moved & (after > f * (1 + tol[active])) & (gain > f * TOL)
              & ((gain > (before - f) / 4) | (after > f * (1 + _CLOSE))))
        active, before = active[go], after[go]  # loads of the stopped steps no longer change
