"""The stratified epoch repair: bring every (label, replica) epoch total within one of its share.

The per-step rounding (:mod:`evenflow.plan.assign.stratified_rounding`) looks at one step
at a time, so a few (label, replica) cells can still end the epoch more than one
sample off. The repair looks at the whole epoch and, while some cell is off by
more than one, lowers a potential of the epoch deviations
(:mod:`evenflow.plan.assign.stratified_potential`: their excess over one first, their
fourth powers second):
1. the best 2x2 interchange that some step allows;
2. when none helps, a longer cycle inside one step (replica r1 gives r2 a sample of
   one class, r2 gives r3 one of another, ..., back to r1) through a cell still
   off by more than one, found as a cheapest walk over replicas
   (:mod:`evenflow.plan.assign.stratified_cycles`);
3. when no single cycle helps, an ejection chain of up to three such cycles in
   different steps: one may push a cell past the bound if the next brings it back.
Every move keeps each step's class and replica counts, and entries stay within
each step's bounds.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.assign.stratified_cycles import cycles_through
from evenflow.plan.assign.stratified_potential import move_prices, potential
from evenflow.plan.assign.stratified_rounding import MAX_INTERCHANGE_ELEMS

_MAX_REPAIR_TRIES = 4096  # improving interchanges tried per repair move before giving up
_CYCLE_TRIES = 64  # cycles checked exactly per cell
_CHAIN_DEPTH = 3  # cycles in one ejection chain
_CHAIN_BRANCH = 8  # first cycles tried per cell when a chain is needed
_MAX_CYCLE_WORK = 1 << 32  # steps x replicas^2 x (classes + walk length), over one repair (~15 s)


def repair_epoch(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, want: np.ndarray) -> None:
    """Move extras between steps' cells, in place, until every epoch total is within one of ``want``.

    Stops early where no interchange, cycle or chain lowers the potential, or once the cycle
    searches have spent their work budget.

    Args:
        x: int64 ``[S, C, R]`` per-step counts (row and column sums are kept).
        lo, hi: int64 ``[S, C, R]`` bounds of each entry.
        want: float ``[C, R]`` epoch shares.
    """
    _, c, r = x.shape
    if c < 2 or r < 2 or c * c * r * r > MAX_INTERCHANGE_ELEMS:
        return
    budget = [_MAX_CYCLE_WORK]
    for _ in range(8 * c * r):
        d = x.sum(axis=0) - want
        if np.abs(d).max() <= 1 + 1e-9:
            return
        if _apply_interchange(x, lo, hi, d):
            continue
        bad = _worst_first(d, np.ones(d.shape, dtype=bool))
        if not _chain_move(x, lo, hi, d, bad, float(potential(d).sum()), _CHAIN_DEPTH,
                           np.zeros(d.shape, dtype=bool), budget):
            return


def _interchange_gains(d: np.ndarray) -> np.ndarray:
    """float ``[i, j, a, b]``: change of the potential by the interchange (class i: a -> b, class j: b -> a).

    It changes d[i, a] and d[j, b] by -1 and d[i, b] and d[j, a] by +1; the potential counts the
    excess over one first and weighs the cells furthest off most. inf where i == j or a == b.
    """
    c, r = d.shape
    _, minus, plus = move_prices(d)
    delta = (minus[:, None, :, None] + plus[:, None, None, :]
             + minus[None, :, None, :] + plus[None, :, :, None])           # [i, j, a, b]
    delta[np.arange(c), np.arange(c)] = np.inf
    delta[:, :, np.arange(r), np.arange(r)] = np.inf
    return delta


def _apply_interchange(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray) -> bool:
    """Apply, in the first step that allows it, the best interchange that lowers the potential.

    Up to ``_MAX_REPAIR_TRIES`` improving interchanges are tried, best first.

    Returns:
        Whether one was applied.
    """
    delta = _interchange_gains(d)
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
            return True
    return False


def _chain_move(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, cells: np.ndarray, base: float,
                depth: int, touched: np.ndarray, budget: list) -> bool:
    """Apply one cycle, or a chain of up to ``depth`` cycles, that brings the potential below ``base``.

    ``cells`` (int ``[K, 2]``) are tried in turn as the cell a cycle must fix. A cycle that fixes one
    may push others past the bound; the chain then goes on from the cells it has ``touched`` that are
    out of bounds (an ejection chain), and is kept only if, as a whole, it lowers the potential.
    ``budget[0]`` counts down the work left to the whole repair's cycle searches, which keeps its
    time bounded where the bound cannot be reached.
    """
    here = float(potential(d).sum())
    for cb, rb in cells.tolist():
        if budget[0] <= 0:
            return False
        cands = cycles_through(x, lo, hi, d, cb, rb, _CYCLE_TRIES, budget)
        if cands and here + cands[0][0] < base - 1e-9:
            _, s, xs = cands[0]
            x[s] = xs
            return True
        if depth <= 1:
            continue
        for _, s, xs in cands[:_CHAIN_BRANCH]:
            d_next = d + xs - x[s]
            t_next = touched | (xs != x[s])
            nxt = _worst_first(d_next, t_next)
            if nxt.shape[0] == 0:
                continue
            keep = x[s].copy()
            x[s] = xs
            if _chain_move(x, lo, hi, d_next, nxt, base, depth - 1, t_next, budget):
                return True
            x[s] = keep
    return False


def _worst_first(d: np.ndarray, among: np.ndarray) -> np.ndarray:
    """int64 ``[K, 2]``: the cells in ``among`` more than one off, furthest off first."""
    cells = np.argwhere(among & (np.abs(d) > 1 + 1e-9))
    return cells[np.argsort(-np.abs(d[cells[:, 0], cells[:, 1]]), kind="stable")]
