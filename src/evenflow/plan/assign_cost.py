"""Cost balancing: split each step so every replica's summed cost, per unit of weight, is equal.

Replica sample counts are free up to a cap of a quarter more than count mode's
slots (:func:`cost_slots`), so a replica that drew one very long sample can take
fewer others. Two passes, both vectorised over all steps at once:

1. Greedy by rounds (LPT): each step's samples are sorted by cost, largest first,
   and handed out in rounds; in each round the participating replicas, least
   loaded (per unit weight) first, take the next largest samples. A replica with
   weight w takes part in a fraction of rounds proportional to its count, spread
   evenly over the sorted order, so it gets large and small samples alike.
2. Refinement: replicas are paired most-loaded with least-loaded (and the most
   loaded with every other), and each pair exchanges the two samples, or moves
   the one sample into a free slot, that best evens out their loads; repeated
   until nothing improves or ``iterations`` passes are done.
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_cost", "cost_slots"]

_MAX_BLOCK_ELEMS = 1 << 22
_ITEM_GREEDY_LIMIT = 1 << 15  # per-sample LPT while (step size x replicas) is small; rounds beyond  # bounds the [steps, pairs, slots, slots] swap tensor (~32 MiB)


def _greedy(sid: np.ndarray, c: np.ndarray, k: np.ndarray, w: np.ndarray, slots: int):
    s, n = sid.shape
    r = k.shape[1]
    m = int(k.max())
    t = np.arange(m)[None, None, :]
    has = t < k[:, :, None]
    rounds = np.floor((t + 0.5) * m / np.maximum(k, 1)[:, :, None]).astype(np.int64)
    part = np.zeros((s, r, m), dtype=bool)
    si, ri, _ = np.nonzero(has)
    part[si, ri, rounds[has]] = True

    out = np.full((s, r, slots), -1, dtype=np.int64)
    cost3 = np.zeros((s, r, slots))
    loads = np.zeros((s, r))
    fill = np.zeros((s, r), dtype=np.int64)
    offset = np.zeros(s, dtype=np.int64)
    lane = np.arange(r)[None, :]
    for j in range(m):
        p = part[:, :, j]
        count = p.sum(axis=1)
        key = np.where(p, loads / w[None, :], np.inf)
        who = np.argsort(key, axis=1, kind="stable")
        take = lane < count[:, None]
        item = np.minimum(offset[:, None] + lane, n - 1)
        srow, col = np.nonzero(take)
        rep = who[srow, col]
        it = item[srow, col]
        slot = fill[srow, rep]
        out[srow, rep, slot] = sid[srow, it]
        cost3[srow, rep, slot] = c[srow, it]
        loads[srow, rep] += c[srow, it]
        fill[srow, rep] += 1
        offset += count
    return out, cost3, loads


def cost_slots(count_slots: int, global_batch_size: int) -> int:
    """Slot width in cost mode: count mode's plus a quarter (at least one), at most G."""
    return min(global_batch_size, count_slots + max(1, -(-count_slots // 4)))


def _greedy_items(sid: np.ndarray, c: np.ndarray, k: np.ndarray, w: np.ndarray, slots: int):
    # Classic LPT with capacities: every sample, largest first, goes to the replica with the
    # least load per unit weight that still has a free slot. O(n * R) per step.
    s, n = sid.shape
    r = k.shape[1]
    out = np.full((s, r, slots), -1, dtype=np.int64)
    cost3 = np.zeros((s, r, slots))
    loads = np.zeros((s, r))
    fill = np.zeros((s, r), dtype=np.int64)
    rows = np.arange(s)
    inv_w = 1.0 / w[None, :]
    for j in range(n):
        key = np.where(fill < slots, loads * inv_w, np.inf)
        rep = np.argmin(key, axis=1)
        slot = fill[rows, rep]
        out[rows, rep, slot] = sid[:, j]
        cost3[rows, rep, slot] = c[:, j]
        loads[rows, rep] += c[:, j]
        fill[rows, rep] += 1
    return out, cost3, loads


def _swap(o, c3, ld, rows, hi, lo, wa, wb) -> bool:
    """Best single exchange between replica pairs (hi, lo) of each step; True if any helped."""
    m = o.shape[2]
    la, lb = ld[rows, hi], ld[rows, lo]
    # A free slot of `lo` counts as a sample of cost 0, so exchanging with it is a move.
    ca = np.where(o[rows, hi] >= 0, c3[rows, hi], np.nan)  # [b, pairs, m]
    cb = c3[rows, lo]
    d = ca[:, :, :, None] - cb[:, :, None, :]          # [b, pairs, m, m]
    new = np.maximum((la[..., None, None] - d) / wa[..., None, None],
                     (lb[..., None, None] + d) / wb[..., None, None])
    b, pairs = hi.shape
    new = np.where(np.isnan(new), np.inf, new).reshape(b, pairs, m * m)
    best = np.argmin(new, axis=2)
    best_val = np.take_along_axis(new, best[..., None], axis=2)[..., 0]
    better = best_val < (la / wa) * (1 - 1e-12)
    # One exchange per step per pass, so two pairs never touch the same replica twice.
    if hi.shape[1] > 1 and hi[0, 0] == hi[0, 1]:
        gain = np.where(better, la / wa - best_val, -np.inf)
        keep = np.argmax(gain, axis=1)
        better = better & (np.arange(pairs)[None, :] == keep[:, None])
    if not better.any():
        return False
    bs, bp = np.nonzero(better)
    i, j = best[bs, bp] // m, best[bs, bp] % m
    ra, rb = hi[bs, bp], lo[bs, bp]
    ida, idb = o[bs, ra, i].copy(), o[bs, rb, j].copy()
    cva, cvb = c3[bs, ra, i].copy(), c3[bs, rb, j].copy()
    o[bs, ra, i], o[bs, rb, j] = idb, ida
    c3[bs, ra, i], c3[bs, rb, j] = cvb, cva
    ld[bs, ra] += cvb - cva
    ld[bs, rb] += cva - cvb
    return True


def _refine(out: np.ndarray, cost3: np.ndarray, loads: np.ndarray, w: np.ndarray, iterations: int) -> None:
    s, r, m = out.shape
    pairs = r // 2
    if pairs == 0 or m == 0:
        return
    block = max(1, _MAX_BLOCK_ELEMS // max(1, (r - 1) * m * m))
    for lo_s in range(0, s, block):
        sl = slice(lo_s, min(s, lo_s + block))
        o, c3, ld = out[sl], cost3[sl], loads[sl]
        b = o.shape[0]
        rows = np.arange(b)[:, None]
        for _ in range(iterations):
            order = np.argsort(ld / w[None, :], axis=1, kind="stable")
            # (a) most loaded with least loaded, second with second, ... all in parallel;
            hi, lo = order[:, ::-1][:, :pairs], order[:, :pairs]
            moved = _swap(o, c3, ld, rows, hi, lo, w[hi], w[lo])
            # (b) the most loaded replica with whichever partner allows the best exchange.
            order = np.argsort(ld / w[None, :], axis=1, kind="stable")
            top = np.repeat(order[:, -1:], r - 1, axis=1)
            rest = order[:, :-1]
            moved = _swap(o, c3, ld, rows, top, rest, w[top], w[rest]) or moved
            if not moved:
                break


def assign_cost(order: np.ndarray, bounds: np.ndarray, counts: np.ndarray, slots: int,
                costs: np.ndarray, weights: np.ndarray, iterations: int = 32) -> np.ndarray:
    """Cost-balanced split of each step.

    Args:
        order, bounds, counts, slots: as in :func:`evenflow.plan.assign_count.assign_contiguous`.
        costs: float64 ``[N]`` cost per sample.
        weights: float64 ``[R]`` relative replica speeds.
        iterations: maximum swap-refinement passes.

    Returns:
        int64 ``[S, R, slots]``, -1 for padding.
    """
    s_steps, r = counts.shape
    ids = np.full((s_steps, r, slots), -1, dtype=np.int64)
    sizes = np.diff(bounds)
    base = int(bounds[0])
    for size in np.unique(sizes):
        if size == 0:
            continue
        steps = np.flatnonzero(sizes == size)
        # Steps of one size are consecutive except for a trailing partial step.
        starts = bounds[steps] - base
        sid = order[starts[:, None] + np.arange(size)[None, :]]
        c = costs[sid]
        desc = np.argsort(-c, axis=1, kind="stable")
        sid = np.take_along_axis(sid, desc, axis=1)
        c = np.take_along_axis(c, desc, axis=1)
        greedy = _greedy_items if size * r <= _ITEM_GREEDY_LIMIT else _greedy
        out, cost3, loads = greedy(sid, c, counts[steps], weights, slots)
        _refine(out, cost3, loads, weights, iterations)
        ids[steps] = out
    # Real samples first in every replica's row.
    return np.take_along_axis(ids, np.argsort(ids < 0, axis=2, kind="stable"), axis=2)
