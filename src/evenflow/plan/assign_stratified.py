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
whole epoch and, while some cell is off by more than one, lowers a potential of
the epoch deviations (their excess over one first, their fourth powers second):
1. the best 2x2 interchange that some step allows;
2. when none helps, a longer cycle inside one step (replica r1 gives r2 a sample of
   one class, r2 gives r3 one of another, ..., back to r1) through a cell still
   off by more than one, found as a cheapest walk over replicas;
3. when no single cycle helps, an ejection chain of up to three such cycles in
   different steps: one may push a cell past the bound if the next brings it back.
Every move keeps each step's class and replica counts, so the step's id set is
untouched, and entries stay within one of each step's share (they may take
``share - 1`` or ``share + 1`` when the share is a whole number).
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_stratified"]


_MAX_INTERCHANGE_ELEMS = 1 << 20
_SPLIT_ABOVE_ELEMS = 1 << 13  # classes^2 x replicas^2 above which a step's interchanges are searched split
_MAX_REPAIR_ELEMS = 1 << 24  # steps x classes x replicas held dense by the epoch repair
_MAX_REPAIR_TRIES = 4096  # improving interchanges tried per repair move before giving up
_MAX_CYCLE_LEN = 16  # moves in one cycle of the repair's escape search
_MAX_CYCLE_ELEMS = 1 << 22  # steps x replicas^2 held at once by the cycle search
_MAX_CYCLE_STEPS = 1 << 12  # steps searched for cycles through one cell
_CYCLE_TRIES = 64  # cycles checked exactly per cell
_CHAIN_DEPTH = 3  # cycles in one ejection chain
_CHAIN_BRANCH = 8  # first cycles tried per cell when a chain is needed
_MAX_CYCLE_WORK = 1 << 32  # steps x replicas^2 x (classes + walk length), over one repair (~15 s)
_EXCESS_WEIGHT = 1e6  # weight of the part of |d| above one in the repair's potential (see _potential)


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
    if c < 2 or r < 2 or c * c * r * r > _MAX_INTERCHANGE_ELEMS:
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


def _potential(d: np.ndarray) -> np.ndarray:
    """Per-cell potential the epoch repair lowers: the excess of |d| over one first, then d^4.

    With d^4 alone a move that brings a cell from 1.01 to 0.01 but two others from 0.001 to
    0.999 looks like a loss, although it is exactly what the bound needs.
    """
    return d ** 4 + _EXCESS_WEIGHT * np.maximum(np.abs(d) - 1, 0)


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
    budget = [_MAX_CYCLE_WORK]
    for _ in range(8 * c * r):
        d = x.sum(axis=0) - want
        if np.abs(d).max() <= 1 + 1e-9:
            return
        # Interchange (class i: a -> b, class j: b -> a) changes d[i, a] and d[j, b] by -1 and
        # d[i, b] and d[j, a] by +1; its gain is measured on the potential, which counts the
        # excess over one first and weighs the cells furthest off most.
        here = _potential(d)
        minus = _potential(d - 1) - here
        plus = _potential(d + 1) - here
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
            bad = _worst_first(d, np.ones(d.shape, dtype=bool))
            if not _chain_move(x, lo, hi, d, bad, float(here.sum()), _CHAIN_DEPTH,
                               np.zeros(d.shape, dtype=bool), budget):
                return


def _cycles_through(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, cb: int, rb: int,
                    limit: int, budget: list) -> list:
    """The cheapest cycles of single-sample moves, each inside one step, that fix cell (cb, rb).

    In step s, moving one sample of class k from replica u to replica v keeps the step's class
    counts; a cycle of such moves r1 -> r2 -> ... -> r1 (each with its own class) keeps every
    replica's count too, and a 2x2 interchange is the cycle of length two. The cycle closes with
    the move that brings d[cb, rb] towards zero; the rest is the cheapest walk back, by walk length
    (Bellman-Ford on the separable change of the potential, the cheapest class per replica pair).

    Returns:
        Up to ``limit`` ``(change of the potential, step, new counts [C, R] of that step)``, best
        first, each within the step's bounds and each with a different change of the epoch totals;
        none once the search would overdraw ``budget[0]``, the work left to the repair.
    """
    _, c, r = x.shape
    here = _potential(d)
    minus = _potential(d - 1) - here               # [C, R] change when a cell loses one
    plus = _potential(d + 1) - here
    can_out = x > lo
    can_in = x < hi
    low = d[cb, rb] < 0                # needs one more (cb: a -> rb), else one fewer (cb: rb -> a)
    if low:
        end = can_out[:, cb, :] & can_in[:, cb, rb, None]
        close = minus[cb] + plus[cb, rb]
    else:
        end = can_in[:, cb, :] & can_out[:, cb, rb, None]
        close = minus[cb, rb] + plus[cb]
    end[:, rb] = False
    steps = np.flatnonzero(end.any(axis=1))[:_MAX_CYCLE_STEPS]
    max_len = min(r - 1, _MAX_CYCLE_LEN)
    budget[0] -= steps.shape[0] * r * r * (c + max_len)
    if budget[0] < 0:
        return []
    chunk = max(1, _MAX_CYCLE_ELEMS // (r * r))
    diag = np.arange(r)
    found = []
    for first in range(0, steps.shape[0], chunk):
        st = steps[first: first + chunk]
        cost_out = np.where(can_out[st], minus[None], np.inf)           # [S', C, R]
        cost_in = np.where(can_in[st], plus[None], np.inf)
        w = np.full((st.shape[0], r, r), np.inf)                          # cheapest move u -> v
        for k in range(c):
            np.minimum(w, cost_out[:, k, :, None] + cost_in[:, k, None, :], out=w)
        w[:, diag, diag] = np.inf
        if not low:                    # the walk runs a -> ... -> rb: search it backwards from rb
            w = w.transpose(0, 2, 1)
        closing = np.where(end[st], close[None, :], np.inf)             # [S', R]
        dist = np.full((st.shape[0], r), np.inf)
        dist[:, rb] = 0.0
        preds = []
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
    # Walks that loop through a cell past the bound look far better than they are (the estimate
    # counts its fix on every pass) and then break the bounds, so short walks are read first;
    # each cycle that fits the step's bounds is then priced exactly.
    found.sort(key=lambda t: (t[1], t[0]))
    base = float(here.sum())
    out, seen = [], set()
    for _, length, preds, st, f in found[: 8 * limit]:
        si, a = divmod(int(f), r)
        walk = [a]
        for pred in reversed(preds[:length]):
            walk.append(int(pred[si, walk[-1]]))
        walk.reverse()                 # rb, ..., a
        s = int(st[si])
        xs = x[s].copy()
        arcs = list(zip(walk[:-1], walk[1:]))
        arcs = arcs if low else [(v, u) for u, v in arcs]
        arcs.append((a, rb) if low else (rb, a))
        for u, v in arcs[:-1]:
            k = int(np.argmin(np.where(can_out[s, :, u] & can_in[s, :, v], minus[:, u] + plus[:, v], np.inf)))
            xs[k, u] -= 1
            xs[k, v] += 1
        xs[cb, arcs[-1][0]] -= 1
        xs[cb, arcs[-1][1]] += 1
        effect = (xs - x[s]).tobytes()           # the same change in another step is kept once
        if effect in seen or np.any(xs < lo[s]) or np.any(xs > hi[s]):
            continue
        seen.add(effect)
        out.append((float(_potential(d + xs - x[s]).sum()) - base, s, xs))
        if len(out) == limit:
            break
    out.sort(key=lambda t: t[0])
    return out


def _chain_move(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, cells: np.ndarray, base: float,
                depth: int, touched: np.ndarray, budget: list) -> bool:
    """Apply one cycle, or a chain of up to ``depth`` cycles, that brings the potential below ``base``.

    ``cells`` (int ``[K, 2]``) are tried in turn as the cell a cycle must fix. A cycle that fixes one
    may push others past the bound; the chain then goes on from the cells it has ``touched`` that are
    out of bounds (an ejection chain), and is kept only if, as a whole, it lowers the potential.
    ``budget[0]`` counts down the work left to the whole repair's cycle searches, which keeps its
    time bounded where the bound cannot be reached.
    """
    here = float(_potential(d).sum())
    for cb, rb in cells.tolist():
        if budget[0] <= 0:
            return False
        cands = _cycles_through(x, lo, hi, d, cb, rb, _CYCLE_TRIES, budget)
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
