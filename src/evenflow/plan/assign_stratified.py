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
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_stratified"]


_MAX_INTERCHANGE_ELEMS = 1 << 20


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
    for s in range(s_steps):
        step = order[bounds[s] - base: bounds[s + 1] - base]
        if step.shape[0] == 0:
            continue
        step_codes = codes[step]
        by_class = np.argsort(step_codes, kind="stable")
        present, n_c = np.unique(step_codes, return_counts=True)
        k_r = counts[s]
        seen_c[present] += n_c
        seen_r += k_r
        target = seen_c[present, None] * seen_r[None, :] / seen_r.sum()
        x = _round_shares(n_c, k_r, target - got[present] - np.floor(n_c[:, None] * k_r[None, :] / k_r.sum() + 1e-9))
        got[present] += x
        # Deal each class's samples (in their random order) to replicas by the counts x[c, r];
        # a replica's slots are filled class after class.
        replica_of = np.repeat(np.tile(np.arange(r), present.shape[0]), x.ravel())
        members = step[by_class]
        by_replica = np.argsort(replica_of, kind="stable")
        starts = np.cumsum(k_r) - k_r
        slot_of = np.empty(members.shape[0], dtype=np.int64)
        slot_of[by_replica] = np.arange(members.shape[0]) - np.repeat(starts, k_r)
        ids[s, replica_of, slot_of] = members
    return ids
