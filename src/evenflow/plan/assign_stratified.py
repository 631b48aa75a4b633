"""Stratified splitting of each step among replicas.

For a step with class counts ``n_c`` and replica counts ``k_r`` (sum ``n``), the
proportional share of class c for replica r is ``A[c, r] = n_c * k_r / n``; this
matrix already has the right row and column sums. We round it to integers
``X[c, r]`` in ``{floor A, floor A + 1}`` with the same sums, so every replica is
within one sample of its share of every label. Such a rounding exists (the
fractional matrix is a feasible point of a transportation polytope) and Ryser's
greedy construction finds one: each class in turn hands its extra samples to the
replicas that still need the most. Then 2x2 interchanges (which keep every row
and column sum, and every entry in its allowed pair) move the extras towards the
(label, replica) cells furthest below their share of the epoch so far, which
keeps epoch totals close to the epoch's share as well.

That steering looks at one step at a time, so a few (label, replica) cells can
still end the epoch more than one sample off. A final repair pass looks at the
whole epoch: while some cell is off by more than one, it applies the 2x2
interchange, in whichever step allows it, that most reduces the sum of fourth
powers of the epoch deviations. Entries then stay within one of each step's share (they may
take ``share - 1`` or ``share + 1`` when the share is a whole number).
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_stratified"]


_MAX_INTERCHANGE_ELEMS = 1 << 20
_MAX_REPAIR_ELEMS = 1 << 24  # steps x classes x replicas held dense by the epoch repair
_MAX_REPAIR_TRIES = 4096  # improving interchanges tried per repair move before giving up


def _interchange(extra: np.ndarray, deficit: np.ndarray, rounds: int = 64) -> None:
    """Local search over 2x2 interchanges of the 0/1 ``extra`` matrix, minimising sum(deficit - extra)^2.

    Moving extras (c, a) -> (c, b) and (d, b) -> (d, a) keeps all margins; it pays off when
    deficit[c, b] + deficit[d, a] - deficit[c, a] - deficit[d, b] > 1 after accounting for the
    extras already placed.
    """
    c, r = extra.shape
    if c < 2 or r < 2 or c * c * r * r > _MAX_INTERCHANGE_ELEMS:
        return
    for _ in range(rounds):
        e = deficit - extra                     # what each cell still lacks after this step
        # gain of moving an extra from (c, a) to (c, b): e[c, b] - e[c, a] - 1 (halved squares)
        on = extra == 1
        off = extra == 0
        g_row = e[:, None, :] - e[:, :, None]   # [c, a, b] = e[c, b] - e[c, a]
        ok_row = on[:, :, None] & off[:, None, :]
        total = g_row[:, None, :, :] + g_row.transpose(0, 2, 1)[None, :, :, :] - 2.0  # [c, d, a, b]
        ok = ok_row[:, None, :, :] & ok_row.transpose(0, 2, 1)[None, :, :, :]
        total = np.where(ok, total, -np.inf)
        best = int(np.argmax(total))
        if total.flat[best] <= 1e-9:
            return
        ci, di, a, b = np.unravel_index(best, total.shape)
        extra[ci, a] -= 1
        extra[ci, b] += 1
        extra[di, b] -= 1
        extra[di, a] += 1


def _round_shares(n_c: np.ndarray, k_r: np.ndarray, deficit: np.ndarray) -> np.ndarray:
    n = int(k_r.sum())
    share = n_c[:, None] * k_r[None, :] / n
    base = np.floor(share + 1e-9).astype(np.int64)
    x = base.copy()
    row_need = n_c - x.sum(axis=1)
    col_need = k_r - x.sum(axis=0)
    frac = share - x
    # Rows with the most extras first (the usual order for Ryser's construction).
    for c in np.argsort(-row_need, kind="stable"):
        need = int(row_need[c])
        if need == 0:
            continue
        # Most remaining column need first; then biggest epoch deficit; then biggest fraction.
        pick = np.lexsort((-frac[c], -deficit[c], -col_need))[:need]
        if col_need[pick].min() <= 0:
            raise RuntimeError("stratified rounding found no feasible replica; this is a bug in evenflow")
        x[c, pick] += 1
        col_need[pick] -= 1
    extra = x - base
    _interchange(extra, deficit)
    return base + extra


def _repair_epoch(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, want: np.ndarray) -> None:
    """Move extras between steps' cells, in place, until every epoch total is within one of ``want``.

    Args:
        x: int64 ``[S, C, R]`` per-step counts (row and column sums are kept).
        lo, hi: int64 ``[S, C, R]`` bounds of each entry.
        want: float ``[C, R]`` epoch shares.
    """
    _, c, r = x.shape
    if c < 2 or r < 2 or c * c * r * r > _MAX_INTERCHANGE_ELEMS:
        return
    for _ in range(8 * c * r):
        d = x.sum(axis=0) - want
        if np.abs(d).max() <= 1 + 1e-9:
            return
        # Interchange (class i: a -> b, class j: b -> a) changes d[i, a] and d[j, b] by -1 and
        # d[i, b] and d[j, a] by +1; its gain is measured on sum(d^4), which weighs the cells
        # furthest off most.
        minus = (d - 1) ** 4 - d ** 4
        plus = (d + 1) ** 4 - d ** 4
        delta = (minus[:, None, :, None] + plus[:, None, None, :]
                 + minus[None, :, None, :] + plus[None, :, :, None])           # [i, j, a, b]
        delta[np.arange(c), np.arange(c)] = np.inf
        delta[:, :, np.arange(r), np.arange(r)] = np.inf
        cand = np.flatnonzero(delta.ravel() < -1e-9)
        cand = cand[np.argsort(delta.ravel()[cand], kind="stable")][:_MAX_REPAIR_TRIES]
        for flat in cand:
            i, j, a, b = np.unravel_index(flat, delta.shape)
            ok = (x[:, i, a] > lo[:, i, a]) & (x[:, i, b] < hi[:, i, b]) \
                & (x[:, j, b] > lo[:, j, b]) & (x[:, j, a] < hi[:, j, a])
            if ok.any():
                s = int(np.argmax(ok))
                x[s, i, a] -= 1
                x[s, i, b] += 1
                x[s, j, b] -= 1
                x[s, j, a] += 1
                break
        else:
            return


def _deal(step: np.ndarray, step_codes: np.ndarray, present: np.ndarray, x: np.ndarray, k_r: np.ndarray,
          out: np.ndarray) -> None:
    # Deal each class's samples (in their random order) to replicas by the counts x[c, r];
    # a replica's slots are filled class after class.
    r = k_r.shape[0]
    by_class = np.argsort(step_codes, kind="stable")
    replica_of = np.repeat(np.tile(np.arange(r), present.shape[0]), x.ravel())
    members = step[by_class]
    by_replica = np.argsort(replica_of, kind="stable")
    starts = np.cumsum(k_r) - k_r
    slot_of = np.empty(members.shape[0], dtype=np.int64)
    slot_of[by_replica] = np.arange(members.shape[0]) - np.repeat(starts, k_r)
    out[replica_of, slot_of] = members


def assign_stratified(order: np.ndarray, bounds: np.ndarray, counts: np.ndarray, slots: int,
                      codes: np.ndarray, num_classes: int) -> np.ndarray:
    """Split each step so every replica's per-label count is within one of its share.

    Args:
        order, bounds, counts, slots: as in :func:`evenflow.plan.assign_count.assign_contiguous`.
        codes: int64 ``[N]`` dense label codes of all samples.
        num_classes: number of distinct codes.

    Returns:
        int64 ``[S, R, slots]``, -1 for padding.
    """
    s_steps, r = counts.shape
    ids = np.full((s_steps, r, slots), -1, dtype=np.int64)
    got = np.zeros((num_classes, r), dtype=np.int64)   # per-label counts so far this epoch
    seen_c = np.zeros(num_classes, dtype=np.int64)
    seen_r = np.zeros(r, dtype=np.int64)
    base = int(bounds[0])
    dense = s_steps * num_classes * r <= _MAX_REPAIR_ELEMS
    if dense:
        x_all = np.zeros((s_steps, num_classes, r), dtype=np.int64)
        lo_all = np.zeros_like(x_all)
        hi_all = np.zeros_like(x_all)
    steps = []
    for s in range(s_steps):
        step = order[bounds[s] - base: bounds[s + 1] - base]
        if step.shape[0] == 0:
            continue
        step_codes = codes[step]
        present, n_c = np.unique(step_codes, return_counts=True)
        k_r = counts[s]
        seen_c[present] += n_c
        seen_r += k_r
        target = seen_c[present, None] * seen_r[None, :] / seen_r.sum()
        share = n_c[:, None] * k_r[None, :] / k_r.sum()
        x = _round_shares(n_c, k_r, target - got[present] - np.floor(share + 1e-9))
        got[present] += x
        if dense:
            x_all[s, present] = x
            lo_all[s, present] = np.maximum(np.ceil(share - 1e-9).astype(np.int64) - 1, 0)
            hi_all[s, present] = np.minimum(np.floor(share + 1e-9).astype(np.int64) + 1,
                                            np.minimum(n_c[:, None], k_r[None, :]))
            steps.append((s, step, step_codes, present))
        else:
            _deal(step, step_codes, present, x, k_r, ids[s])
    if dense:
        _repair_epoch(x_all, lo_all, hi_all, seen_c[:, None] * seen_r[None, :] / max(1, seen_r.sum()))
        for s, step, step_codes, present in steps:
            _deal(step, step_codes, present, x_all[s, present], counts[s], ids[s])
    return ids
