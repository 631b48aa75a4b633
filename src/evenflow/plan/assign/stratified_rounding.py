"""Rounding one step's proportional label shares to integers, steered by the epoch so far.

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

MAX_INTERCHANGE_ELEMS = 1 << 20  # classes^2 x replicas^2 above which no 2x2 interchange table is searched
_SPLIT_ABOVE_ELEMS = 1 << 13  # classes^2 x replicas^2 above which a step's interchanges are searched split


def _best_full(extra: np.ndarray, e: np.ndarray):
    """The best interchange ``(c, d, a, b, gain)`` from the whole ``[c, d, a, b]`` table of gains."""
    on = extra == 1
    off = extra == 0
    # gain of moving an extra from (c, a) to (c, b): e[c, b] - e[c, a] - 1 (halved squares)
    g_row = e[:, None, :] - e[:, :, None]   # [c, a, b] = e[c, b] - e[c, a]
    ok_row = on[:, :, None] & off[:, None, :]
    total = g_row[:, None, :, :] + g_row.transpose(0, 2, 1)[None, :, :, :] - 2.0  # [c, d, a, b]
    ok = ok_row[:, None, :, :] & ok_row.transpose(0, 2, 1)[None, :, :, :]
    total = np.where(ok, total, -np.inf)
    best = int(np.argmax(total))
    return (*np.unravel_index(best, total.shape), total.flat[best])


def _best_split(extra: np.ndarray, e: np.ndarray, tol: float):
    """The same move as :func:`_best_full` (same gain, same tie-break) without the ``r^2`` table.

    The gain (e[c, b] - e[c, a]) + (e[d, a] - e[d, b]) - 2 is a part in a plus a part in b for each
    class pair (c, d), so each pair's best (a, b) takes O(r). Those sums round differently from the
    table's by a few ulps, so every move within ``tol`` (far above that) of the best is then priced
    exactly as the table does, and the first in (c, d, a, b) order among equals wins.
    """
    on = extra == 1
    off = extra == 0
    # v[c, d, a] = e[d, a] - e[c, a] where (c, a) can give and (d, a) take; the b part of the
    # pair (c, d) is v[d, c, b].
    v = np.where(on[:, None, :] & off[None, :, :], e[None, :, :] - e[:, None, :], -np.inf)
    v_max = v.max(axis=2)
    pair = v_max + v_max.T - 2.0
    best = pair.max()
    if not best > 1e-9 - tol:
        return None
    ci, di = np.nonzero(pair >= best - tol)        # in (c, d) order
    pa, a = np.nonzero(v[ci, di] >= v_max[ci, di, None] - tol)
    pb, b = np.nonzero(v[di, ci] >= v_max[di, ci, None] - tol)
    # Every near-best a of a pair with every near-best b of it, in (c, d, a, b) order.
    nb = np.bincount(pb, minlength=ci.shape[0])
    rep = nb[pa]
    first_b = np.repeat(np.cumsum(nb)[pa] - rep, rep)
    b = b[first_b + np.arange(first_b.shape[0]) - np.repeat(np.cumsum(rep) - rep, rep)]
    a = np.repeat(a, rep)
    ci, di = np.repeat(ci[pa], rep), np.repeat(di[pa], rep)
    total = (e[ci, b] - e[ci, a]) + (e[di, a] - e[di, b]) - 2.0
    k = int(np.argmax(total))
    return ci[k], di[k], a[k], b[k], total[k]


def _interchange(extra: np.ndarray, deficit: np.ndarray, rounds: int = 64) -> None:
    """Local search over 2x2 interchanges of the 0/1 ``extra`` matrix, minimising sum(deficit - extra)^2.

    Moving extras (c, a) -> (c, b) and (d, b) -> (d, a) keeps all margins; it pays off when
    deficit[c, b] + deficit[d, a] - deficit[c, a] - deficit[d, b] > 1 after accounting for the
    extras already placed. Each round applies the best such move.
    """
    c, r = extra.shape
    if c < 2 or r < 2 or c * c * r * r > MAX_INTERCHANGE_ELEMS:
        return
    small = c * c * r * r <= _SPLIT_ABOVE_ELEMS
    tol = 1e-9 * (2.0 + float(np.abs(deficit).max()))   # |e| <= |deficit| + 1
    for _ in range(rounds):
        e = deficit - extra                     # what each cell still lacks after this step
        move = _best_full(extra, e) if small else _best_split(extra, e, tol)
        if move is None or move[4] <= 1e-9:
            return
        ci, di, a, b, _ = move
        extra[ci, a] -= 1
        extra[ci, b] += 1
        extra[di, b] -= 1
        extra[di, a] += 1


def round_shares(n_c: np.ndarray, k_r: np.ndarray, deficit: np.ndarray) -> np.ndarray:
    """One step's per-(label, replica) counts: Ryser's rounding, then interchanges towards ``deficit``.

    Args:
        n_c: int64 ``[C']`` samples of each label present in the step.
        k_r: int64 ``[R]`` real samples of each replica in the step.
        deficit: float ``[C', R]``, what each cell still lacks of its epoch share so far once it
            holds the floor of its share of this step; extras are steered to where it is largest.

    Returns:
        int64 ``[C', R]`` counts with row sums ``n_c`` and column sums ``k_r``, each the floor
        of its share of the step or one more.
    """
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
