"""Cost balancing: split each step so every replica's summed cost, per unit of weight, is equal.

Replica sample counts are free up to a cap of a quarter more than count mode's
slots (:func:`cost_slots`), so a replica that drew one very long sample can take
fewer others. Steps are planned in chunks of about 2**18 samples, so temporaries
stay bounded whatever N is, and each chunk is vectorised over its steps:

1. Greedy (LPT): each step's samples are sorted by cost, largest first, and each
   goes to the replica with the least load per unit weight that has a free slot —
   sample by sample for small steps, in rounds (the participating replicas, least
   loaded first, take the next largest samples) for large ones.
2. Refinement: replicas are paired most-loaded with least-loaded (and the most
   loaded with the 16 least loaded), and each pair exchanges the two samples, or
   moves one sample into a free slot, that best evens out their loads. A step
   stops as soon as a pass finds nothing better or its maximum reaches the lower
   bound max(mean load, largest sample / largest weight).
3. With bucketing (``runs=True``) a second split is tried: contiguous runs of the
   cost-sorted step, cut where the running cost reaches each replica's share, then
   refined. Samples of similar cost then share a batch, so padding each batch to
   its longest sample wastes little; the runs are kept in every step where they
   balance within 1% of the greedy split.
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_cost", "cost_slots"]

_ITEM_GREEDY_LIMIT = 1 << 15  # per-sample LPT while (step size x replicas) is small; rounds beyond
_CHUNK_SAMPLES = 1 << 18  # samples planned together: bounds every temporary by this, not by N
_SWAP_ELEMS = 1 << 21  # bounds the [steps, pairs, slots, slots] exchange tensor (16 MiB of float64)
_PARTNERS = 16  # least-loaded replicas the most loaded one tries in refinement pass (b)
_TOL = 1e-4  # a step within this fraction of its lower bound is left as it is
_RUNS_SLACK = 0.01  # how much worse than the greedy's a runs split may balance and still be kept


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


def _runs(sid: np.ndarray, c: np.ndarray, k: np.ndarray, w: np.ndarray, slots: int):
    # Contiguous runs of the cost-sorted step: replica r takes the r-th run, cut where the
    # running cost reaches its cumulative share. Neighbours in cost order share a batch, so
    # padding each batch to its longest sample wastes little (used with bucketing).
    s, n = sid.shape
    r = k.shape[1]
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
    one = 1 if n >= r else 0  # every replica gets a sample when there are enough
    for j in range(1, r):
        low = np.maximum(cuts[:, j - 1] + one, n - slots * (r - j))
        high = np.minimum(cuts[:, j - 1] + slots, n - one * (r - j))
        cuts[:, j] = np.clip(cuts[:, j], low, high)
    counts = np.diff(cuts, axis=1)
    fill = np.arange(slots)[None, None, :] < counts[:, :, None]
    out = np.full((s, r, slots), -1, dtype=np.int64)
    cost3 = np.zeros((s, r, slots))
    out[fill] = sid.ravel()  # C order of the mask is the order of the runs
    cost3[fill] = c.ravel()
    return out, cost3, cost3.sum(axis=2)


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


def _swap(o, c3, ld, rows, hi, lo, wa, wb) -> np.ndarray:
    """Best single exchange between replica pairs (hi, lo) of each step; bool [b]: which steps improved."""
    m = o.shape[2]
    la, lb = ld[rows, hi], ld[rows, lo]
    # A free slot of `lo` counts as a sample of cost 0, so exchanging with it is a move; a free
    # slot of `hi` counts as infinitely costly, so it is never picked.
    ca = np.where(o[rows, hi] >= 0, c3[rows, hi], np.inf)  # [b, pairs, m]
    cb = c3[rows, lo]
    # Load per unit weight of both replicas after exchanging slot i of hi with slot j of lo,
    # the larger of the two, computed in place: two [b, pairs, m, m] buffers in all.
    d = ca[:, :, :, None] - cb[:, :, None, :]          # [b, pairs, m, m]
    new = la[..., None, None] - d
    new /= wa[..., None, None]
    d += lb[..., None, None]
    d /= wb[..., None, None]
    np.maximum(new, d, out=new)
    del d
    b, pairs = hi.shape
    new = new.reshape(b, pairs, m * m)
    best = np.argmin(new, axis=2)
    best_val = np.take_along_axis(new, best[..., None], axis=2)[..., 0]
    better = best_val < (la / wa) * (1 - 1e-12)
    # One exchange per step per pass, so two pairs never touch the same replica twice.
    if pairs > 1 and hi[0, 0] == hi[0, 1]:
        gain = np.where(better, la / wa - best_val, -np.inf)
        keep = np.argmax(gain, axis=1)
        better = better & (np.arange(pairs)[None, :] == keep[:, None])
    bs, bp = np.nonzero(better)
    if bs.size:
        i, j = best[bs, bp] // m, best[bs, bp] % m
        ra, rb = hi[bs, bp], lo[bs, bp]
        ida, idb = o[bs, ra, i].copy(), o[bs, rb, j].copy()
        cva, cvb = c3[bs, ra, i].copy(), c3[bs, rb, j].copy()
        o[bs, ra, i], o[bs, rb, j] = idb, ida
        c3[bs, ra, i], c3[bs, rb, j] = cvb, cva
        ld[bs, ra] += cvb - cva
        ld[bs, rb] += cva - cvb
    return better.any(axis=1)


def _refine(out: np.ndarray, cost3: np.ndarray, loads: np.ndarray, w: np.ndarray, floor: np.ndarray,
            iterations: int) -> None:
    """Pairwise exchanges, in place, on the steps that are not yet within ``_TOL`` of ``floor``."""
    s, r, m = out.shape
    pairs = r // 2
    if pairs == 0 or m == 0:
        return
    partners = min(_PARTNERS, r - 1)
    inv_w = 1.0 / w[None, :]
    active = np.flatnonzero((loads * inv_w).max(axis=1) > floor * (1 + _TOL))
    for _ in range(iterations):
        if active.size == 0:
            return
        # Work on compact copies of the steps still improving; a step drops out for good once
        # it reaches its lower bound or a pass finds nothing better.
        o, c3, ld = out[active], cost3[active], loads[active]
        rows = np.arange(active.size)[:, None]
        # (a) most loaded with least loaded, second with second, ... all in parallel;
        order = np.argsort(ld * inv_w, axis=1, kind="stable")
        hi, lo = order[:, ::-1][:, :pairs], order[:, :pairs]
        moved = _swap(o, c3, ld, rows, hi, lo, w[hi], w[lo])
        # (b) the most loaded replica with whichever of the least loaded allows the best exchange.
        order = np.argsort(ld * inv_w, axis=1, kind="stable")
        top = np.repeat(order[:, -1:], partners, axis=1)
        rest = order[:, :partners]
        moved |= _swap(o, c3, ld, rows, top, rest, w[top], w[rest])
        out[active], cost3[active], loads[active] = o, c3, ld
        active = active[moved & ((ld * inv_w).max(axis=1) > floor[active] * (1 + _TOL))]


def _split_steps(sid: np.ndarray, counts: np.ndarray, slots: int, costs: np.ndarray, w: np.ndarray,
                 iterations: int, runs: bool) -> np.ndarray:
    """Cost-balanced ``[steps, R, slots]`` layout of equal-size steps ``sid`` ``[steps, n]``."""
    n = sid.shape[1]
    r = counts.shape[1]
    c = costs[sid]
    desc = np.argsort(-c, axis=1, kind="stable")
    sid = np.take_along_axis(sid, desc, axis=1)
    c = np.take_along_axis(c, desc, axis=1)
    del desc
    # No split can beat the step's mean load, nor its largest sample on the fastest replica.
    floor = np.maximum(c.sum(axis=1) / w.sum(), c[:, 0] / w.max())
    greedy = _greedy_items if n * r <= _ITEM_GREEDY_LIMIT else _greedy
    out, cost3, loads = greedy(sid, c, counts, w, slots)
    _refine(out, cost3, loads, w, floor, iterations)
    if runs:
        # Runs pad less but can get stuck a sample away from balance (a replica two samples
        # over its neighbours in a step of near-equal costs); keep them where they balance
        # as well as the greedy split.
        r_out, r_cost3, r_loads = _runs(sid, c, counts, w, slots)
        _refine(r_out, r_cost3, r_loads, w, floor, iterations)
        ok = (r_loads / w).max(axis=1) <= (loads / w).max(axis=1) * (1 + _RUNS_SLACK)
        out[ok] = r_out[ok]
    del sid, c
    # Real samples first in every replica's row.
    return np.take_along_axis(out, np.argsort(out < 0, axis=2, kind="stable"), axis=2)


def assign_cost(order: np.ndarray, bounds: np.ndarray, counts: np.ndarray, slots: int,
                costs: np.ndarray, weights: np.ndarray, iterations: int = 32, runs: bool = False) -> np.ndarray:
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
    ids = np.empty((s_steps, r, slots), dtype=np.int64)
    sizes = np.diff(bounds)
    base = int(bounds[0])
    pairs = max(1, r // 2, min(_PARTNERS, r - 1))
    for size in np.unique(sizes):
        steps = np.flatnonzero(sizes == size)
        if size == 0:
            ids[steps] = -1
            continue
        chunk = max(1, min(_CHUNK_SAMPLES // int(size), _SWAP_ELEMS // (pairs * slots * slots)))
        for lo in range(0, steps.size, chunk):
            part = steps[lo:lo + chunk]
            starts = bounds[part] - base
            sid = order[starts[:, None] + np.arange(size)[None, :]]
            ids[part] = _split_steps(sid, counts[part], slots, costs, weights, iterations, runs)
    return ids
