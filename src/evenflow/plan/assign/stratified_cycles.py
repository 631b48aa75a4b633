"""Cycles of single-sample moves inside one step that bring one epoch cell towards its share.

In step s, moving one sample of class k from replica u to replica v keeps the
step's class counts; a cycle of such moves r1 -> r2 -> ... -> r1 (each with its
own class) keeps every replica's count too, and a 2x2 interchange is the cycle of
length two. The stratified epoch repair uses these cycles where no 2x2 interchange
lowers its potential (:mod:`evenflow.plan.assign.stratified_potential`). A cycle through
cell (cb, rb) closes with the move of class cb that brings the cell's deviation
towards zero; the rest is the cheapest walk back, found by Bellman-Ford over the
replicas, for all candidate steps at once, on the separable change of the
potential (each pair of replicas joined by its cheapest class). The walks found
are estimates; each one that fits its step's bounds is then priced exactly.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evenflow.plan.assign.stratified_potential import move_prices, potential

_MAX_CYCLE_LEN = 16  # moves in one cycle of the repair's escape search
_MAX_CYCLE_ELEMS = 1 << 22  # steps x replicas^2 held at once by the cycle search
_MAX_CYCLE_STEPS = 1 << 12  # steps searched for cycles through one cell


class _Search(NamedTuple):
    """One search for cycles through cell (cb, rb), and what each single-sample move may do and costs."""

    x: np.ndarray        # int64 [S, C, R] per-step counts
    lo: np.ndarray       # int64 [S, C, R] lowest allowed count
    hi: np.ndarray       # int64 [S, C, R] highest allowed count
    d: np.ndarray        # float [C, R] epoch deviations
    cb: int              # class of the cell to fix
    rb: int              # replica of the cell to fix
    low: bool            # d[cb, rb] < 0: the cycle brings rb one more of cb (cb: a -> rb), else one fewer
    can_out: np.ndarray  # bool [S, C, R]: the entry may lose one
    can_in: np.ndarray   # bool [S, C, R]: the entry may gain one
    minus: np.ndarray    # float [C, R] change of the potential when a cell loses one
    plus: np.ndarray     # float [C, R] change of the potential when a cell gains one
    base: float          # the potential now


def cycles_through(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, cb: int, rb: int,
                   limit: int, budget: list) -> list:
    """The cheapest cycles of single-sample moves, each inside one step, that fix cell (cb, rb).

    The cycle closes with the move that brings d[cb, rb] towards zero; the rest is the cheapest
    walk back, by walk length (Bellman-Ford on the separable change of the potential, the cheapest
    class per replica pair).

    Args:
        x: int64 ``[S, C, R]`` per-step counts.
        lo, hi: int64 ``[S, C, R]`` bounds of each entry.
        d: float ``[C, R]`` epoch deviations of ``x``.
        cb, rb: the cell to fix, more than one off its share.
        limit: most cycles returned.
        budget: one-element list, the work left to the repair's cycle searches; counted down here.

    Returns:
        Up to ``limit`` ``(change of the potential, step, new counts [C, R] of that step)``, best
        first, each within the step's bounds and each with a different change of the epoch totals;
        none once the search would overdraw ``budget[0]``, the work left to the repair.
    """
    _, c, r = x.shape
    here, minus, plus = move_prices(d)
    search = _Search(x, lo, hi, d, cb, rb, d[cb, rb] < 0, x > lo, x < hi, minus, plus, float(here.sum()))
    end, close = _closing_moves(search)
    steps = np.flatnonzero(end.any(axis=1))[:_MAX_CYCLE_STEPS]
    max_len = min(r - 1, _MAX_CYCLE_LEN)
    budget[0] -= steps.shape[0] * r * r * (c + max_len)
    if budget[0] < 0:
        return []
    chunk = max(1, _MAX_CYCLE_ELEMS // (r * r))
    found = []
    for first in range(0, steps.shape[0], chunk):
        st = steps[first: first + chunk]
        w = _cheapest_moves(search, st)
        if not search.low:             # the walk runs a -> ... -> rb: search it backwards from rb
            w = w.transpose(0, 2, 1)
        closing = np.where(end[st], close[None, :], np.inf)             # [S', R]
        found.extend(_cheap_walks(w, closing, rb, max_len, st))
    # Walks that loop through a cell past the bound look far better than they are (the estimate
    # counts its fix on every pass) and then break the bounds, so short walks are read first;
    # each cycle that fits the step's bounds is then priced exactly.
    found.sort(key=lambda t: (t[1], t[0]))
    return _priced_cycles(search, found[: 8 * limit], limit)


def _closing_moves(search: _Search) -> tuple[np.ndarray, np.ndarray]:
    """Where the closing move of class cb can run, and its change of the potential.

    Returns:
        ``(end, close)``: bool ``[S, R]``, whether step s can move one of cb between replica a and
        rb in the direction that fixes the cell, and float ``[R]``, that move's change by a.
    """
    cb, rb = search.cb, search.rb
    if search.low:
        end = search.can_out[:, cb, :] & search.can_in[:, cb, rb, None]
        close = search.minus[cb] + search.plus[cb, rb]
    else:
        end = search.can_in[:, cb, :] & search.can_out[:, cb, rb, None]
        close = search.minus[cb, rb] + search.plus[cb]
    end[:, rb] = False
    return end, close


def _cheapest_moves(search: _Search, st: np.ndarray) -> np.ndarray:
    """float ``[S', R, R]``: in each step of ``st``, the cheapest move of one sample from u to v.

    A move takes the class that changes the potential least; inf where no class can move, and
    on the diagonal.
    """
    _, c, r = search.x.shape
    cost_out = np.where(search.can_out[st], search.minus[None], np.inf)  # [S', C, R]
    cost_in = np.where(search.can_in[st], search.plus[None], np.inf)
    w = np.full((st.shape[0], r, r), np.inf)
    for k in range(c):
        np.minimum(w, cost_out[:, k, :, None] + cost_in[:, k, None, :], out=w)
    diag = np.arange(r)
    w[:, diag, diag] = np.inf
    return w


def _cheap_walks(w: np.ndarray, closing: np.ndarray, rb: int, max_len: int, st: np.ndarray) -> list:
    """Bellman-Ford from rb over ``w``: the best two steps for each walk length and end replica.

    Returns:
        ``(estimated change, walk length, predecessors, st, flat index step * R + end replica)``
        per walk that can close; ``predecessors[i]`` is int ``[S', R]``, the replica before each
        one at length ``i + 1`` (the list is shared by all walks of this search).
    """
    r = closing.shape[1]
    diag = np.arange(r)
    dist = np.full((st.shape[0], r), np.inf)
    dist[:, rb] = 0.0
    preds, found = [], []
    for _ in range(max_len):
        via = dist[:, :, None] + w                                   # [S', u, v]
        pred = np.argmin(via, axis=1)
        dist = np.take_along_axis(via, pred[:, None, :], axis=1)[:, 0, :]
        preds.append(pred)
        # The best two steps for each replica the walk ends at: many steps offer the same
        # cycle, and a list of the overall best would hold little else.
        total = dist + closing
        best = (np.argsort(total, axis=0, kind="stable")[:2] * r + diag).ravel()
        total = total.ravel()
        best = best[np.isfinite(total[best])]
        found.extend((float(total[f]), len(preds), preds, st, f) for f in best)
        if not np.isfinite(dist).any():
            break
    return found


def _priced_cycles(search: _Search, found: list, limit: int) -> list:
    """The first ``limit`` walks of ``found`` whose cycles fit their step's bounds, priced exactly, best first.

    A cycle whose change of the epoch totals an earlier one already makes (in another step) is
    skipped.
    """
    r = search.x.shape[2]
    out, seen = [], set()
    for _, length, preds, st, f in found:
        si, a = divmod(int(f), r)
        s = int(st[si])
        xs = _cycle_counts(search, s, _walk(preds[:length], si, a))
        effect = (xs - search.x[s]).tobytes()           # the same change in another step is kept once
        if effect in seen or np.any(xs < search.lo[s]) or np.any(xs > search.hi[s]):
            continue
        seen.add(effect)
        out.append((float(potential(search.d + xs - search.x[s]).sum()) - search.base, s, xs))
        if len(out) == limit:
            break
    out.sort(key=lambda t: t[0])
    return out


def _walk(preds: list, si: int, a: int) -> list:
    """The replicas of the walk of ``len(preds)`` moves that ends at ``a`` in step ``si``: rb, ..., a."""
    walk = [a]
    for pred in reversed(preds):
        walk.append(int(pred[si, walk[-1]]))
    walk.reverse()
    return walk


def _cycle_counts(search: _Search, s: int, walk: list) -> np.ndarray:
    """int64 ``[C, R]``: step s's counts after the cycle along ``walk`` (rb, ..., a) and its closing move.

    Each move of the walk takes its cheapest class; the closing move takes class cb.
    """
    a, rb = walk[-1], search.rb
    arcs = list(zip(walk[:-1], walk[1:]))
    if not search.low:
        arcs = [(v, u) for u, v in arcs]
    xs = search.x[s].copy()
    for u, v in arcs:
        price = np.where(search.can_out[s, :, u] & search.can_in[s, :, v],
                         search.minus[:, u] + search.plus[:, v], np.inf)
        k = int(np.argmin(price))
        xs[k, u] -= 1
        xs[k, v] += 1
    u, v = (a, rb) if search.low else (rb, a)
    xs[search.cb, u] -= 1
    xs[search.cb, v] += 1
    return xs
