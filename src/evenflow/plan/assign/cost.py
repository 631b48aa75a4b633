"""Cost balancing: split each step so every replica's summed cost, per unit of weight, is equal.

Replica sample counts are free up to a cap of a quarter more than count mode's
slots (:func:`cost_slots`), so a replica that drew one very long sample can take
fewer others. Steps are planned in chunks of about 2**19 samples, so temporaries
stay bounded whatever N is, and each chunk is vectorised over its steps; a short last
step is padded into its chunk (padding sorts last and is never placed), so a window
costs one pass of the pipeline, not one per step size:

1. Greedy (LPT in rounds): each step's samples are sorted by cost, largest first.
   In every round the replicas whose load per unit weight is at most the lowest one
   plus the next sample's cost each take one sample, the least loaded the largest;
   a replica that drew a long sample sits out rounds until the others catch up, as
   in sample-by-sample LPT, and a replica with all slots full sits out for good.
2. Refinement (:mod:`evenflow.plan.assign.cost_refine`): replicas are paired most
   loaded with least loaded, and each pair exchanges the two samples, or moves one
   sample into a free slot, that best evens out their loads, until a step is within
   a small tolerance of its lower bound max(mean load, largest sample / largest weight).
3. With bucketing (``runs=True``) a second split is tried: contiguous runs of the
   cost-sorted step (:mod:`evenflow.plan.assign.runs`), then refined. Samples of similar
   cost then share a batch, so padding each batch to its longest sample wastes little;
   the runs are kept in every step where they balance within 1% of the greedy split. A pass
   of the refinement takes at most one of a replica's own samples off it, so where even that
   many passes cannot bring the runs within 1% of the greedy split, they are not refined at all.

Chunks are planned on every core in threads; when there is only one chunk (a single large
step, as for one worker's first step of a huge epoch), its refinement uses the cores instead.
The result never depends on the number of threads.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from evenflow.plan.assign.cost_refine import refine, row_max
from evenflow.plan.assign.runs import runs_split
from evenflow.plan.parallel import cores

_CHUNK_SAMPLES = 1 << 19  # samples planned together: bounds every temporary by this, not by N
_PARALLEL_MIN = 1 << 17  # samples per chunk below which chunks are not split further across cores
_RADIX_FROM = 512  # steps this large are sorted by a 16-bit cost key (radix sort), smaller ones exactly
_STABLE_FROM = 2048  # replicas from which the greedy's row sorts run as merges (long rows stay nearly sorted)
_RUNS_SLACK = 0.01  # how much worse than the greedy's a runs split may balance and still be kept


def _bits(x: int) -> int:
    return max(1, int(x).bit_length())


def _sort_desc(sid: np.ndarray, c: np.ndarray):
    """Each step's samples by cost, largest first (ties by position); ``c`` is overwritten."""
    s, n = c.shape
    c += 0.0  # -0.0 to 0.0, whose bits sort as the smallest
    if n >= _RADIX_FROM:
        # Costs rounded to 8 significant bits: a stable radix sort, and the greedy only needs
        # the order up to such rounding (the refinement works on exact costs).
        q = ~(c.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        pos = np.argsort(q, axis=1, kind="stable")
    else:
        # The complement of a non-negative float's bits ascends as the float descends: one
        # ascending sort gives largest first, ties by position, with no reversed copy.
        low = np.int64((1 << _bits(n - 1)) - 1)
        key = ~c.view(np.int64) & ~low
        key |= np.arange(n)
        key.sort(axis=1)
        pos = key & low
    pos += (np.arange(s) * n)[:, None]
    pos = pos.ravel()
    return sid.ravel()[pos].reshape(s, n), c.ravel()[pos].reshape(s, n)


def _step_windows(c: np.ndarray, w: np.ndarray, equal: bool):
    """The greedy's reads and writes: ``(items, tags, tag_rows)``.

    Each step's costs (per unit of weight when all weights are equal) are laid out flat with r
    zero-cost entries past its end, and ``tags`` beside them. Row k of the sliding views ``items``
    and ``tag_rows`` is the r entries from k on: a step's next r samples, and where their tags go;
    thanks to the zero-cost entries a row never reaches into the next step.
    """
    (s, n), r = c.shape, w.shape[0]
    flat = np.zeros((s, n + r))
    flat[:, :n] = c / w[0] if equal else c
    tags = np.empty(s * (n + r), np.int64)
    return sliding_window_view(flat.ravel(), r), tags, sliding_window_view(tags, r, writeable=True)


def _greedy(c: np.ndarray, w: np.ndarray, slots: int, count: np.ndarray) -> np.ndarray:
    """LPT in rounds over cost-sorted steps ``c`` ``[s, n]`` whose first ``count[i]`` samples are real.

    Returns int64 ``[s, n + R]``: ``(slot << bits(R - 1)) | replica`` of every real sample (the
    rest is scratch).
    """
    s, n = c.shape
    r = w.shape[0]
    ib = _bits(r - 1)
    one = np.int64(1 << ib)
    low = np.int64((1 << (ib + _bits(slots))) - 1)
    equal = bool(np.all(w == w[0]))
    items, tags, tag_rows = _step_windows(c, w, equal)
    inv_w = 1.0 / w
    # Each replica's state in one sortable int64: load per weight in the high bits, then its
    # filled slots, then its id; sorting a row orders the replicas by load.
    key = np.broadcast_to(np.arange(r, dtype=np.int64), (s, r)).copy()
    start = np.arange(s, dtype=np.int64) * (n + r)  # each unfinished step's next sample in flat
    left = count.astype(np.int64)
    lane = np.arange(r)
    below = np.zeros((s, r + 1), dtype=bool)  # a last False column: argmin finds the first False of every row
    kind = "stable" if r >= _STABLE_FROM else None
    rounds = 0
    sure = int(left.min()) // r if left.size else 0  # rounds in which no step can run short of samples
    while start.size:
        tag = key & low
        load = (key & ~low).view(np.float64)
        item = items[start]
        if not equal:
            item *= inv_w[tag & (one - 1)]
        # The replicas within one sample of the least loaded take a sample each, largest to least
        # (loads ascend along a row, so they are a prefix of it), at most the step's samples left.
        within = below[:start.size]
        np.less_equal(load, (load[:, 0] + item[:, 0])[:, None], out=within[:, :r])
        p = within.argmin(axis=1)
        short = np.flatnonzero(p > left) if rounds >= sure - 1 else ()
        if len(short):
            p[short] = left[short]
            within[short, :r] = lane < p[short, None]
        take = within[:, :r]
        tag_rows[start] = tag  # lanes past p write where a later round (or the scratch) overwrites
        item *= take
        load += item
        tag += take * one
        rounds += 1
        if rounds >= slots:
            load[(tag >> ib) >= slots] = np.inf
        key = load.view(np.int64)
        key &= ~low
        key |= tag
        key.sort(axis=1, kind=kind)
        start += p
        left -= p
        # A round takes at most r samples of a step: before round ``sure`` none has finished.
        if rounds >= sure and not (keep := left > 0).all():
            key, start, left = key[keep], start[keep], left[keep]
            if left.size:  # the short last step is often the first to finish: the others have longer
                sure = rounds + int(left.min()) // r
    return tags.reshape(s, n + r)


def _place(sid: np.ndarray, c: np.ndarray, tags: np.ndarray, r: int, slots: int, real: int):
    """``[s, R, slots]`` ids and costs, loads ``[s, R]`` and filled slots ``[s, R]`` of a split.

    Only the first ``real`` samples of ``sid`` (row after row) are placed: padding comes last.
    """
    s, n = sid.shape
    ib = _bits(r - 1)
    t = tags[:, :n]
    lanes = (t & ((1 << ib) - 1)) + (np.arange(s, dtype=np.int64) * r)[:, None]
    dest = lanes * slots + (t >> ib)
    lanes, dest, cr = lanes.ravel()[:real], dest.ravel()[:real], c.ravel()[:real]
    out = np.full(s * r * slots, -1, dtype=np.int64)
    out[dest] = sid.ravel()[:real]
    cost3 = np.zeros(s * r * slots)
    cost3[dest] = cr
    loads = np.bincount(lanes, weights=cr, minlength=s * r).reshape(s, r)
    fill = np.bincount(lanes, minlength=s * r).reshape(s, r)
    return out.reshape(s, r, slots), cost3.reshape(s, r, slots), loads, fill


def cost_slots(count_slots: int, global_batch_size: int) -> int:
    """Slot width in cost mode: count mode's plus a quarter (at least one), at most G."""
    return min(global_batch_size, count_slots + max(1, -(-count_slots // 4)))


def _split_steps(sid: np.ndarray, count: np.ndarray, slots: int, costs: np.ndarray, w: np.ndarray,
                 iterations: int, runs: bool, threads: int = 1) -> np.ndarray:
    """Cost-balanced ``[steps, R, slots]`` layout of steps ``sid`` ``[steps, n]``.

    Row i holds step i's ``count[i]`` samples, then -1; only the last row may be short. The
    refinement rates its exchanges on ``threads`` threads.
    """
    s, n = sid.shape
    real = s * n - (n - int(count[-1]))
    c = costs[sid]
    c.ravel()[real:] = 0.0  # padding costs nothing, so it sorts after every sample of its step
    sid, c = _sort_desc(sid, c)
    # No split can beat the step's mean load, nor its largest sample on the fastest replica.
    top = c[:, 0] if n < _RADIX_FROM else c.max(axis=1)  # exactly sorted rows start with their largest
    floor = np.maximum(c.sum(axis=1) / w.sum(), top / w.max())
    if not runs:
        return _greedy_split(sid, c, w, slots, count, floor, iterations, real, threads)[0]
    # Runs pad less but can get stuck a sample away from balance (a replica two samples over its
    # neighbours in a step of near-equal costs); they are kept where they balance as well as the
    # greedy split. Where they are within that slack of the floor, no greedy split can do better
    # by more, so the greedy split is planned only for the other steps (the same result, sooner).
    split = runs_split(sid, c, w, slots)
    out, r_cost3, r_loads = split[0], split[1], split[2]
    # Each refinement pass gives away at most one sample per replica, and a sample it had received
    # takes back only what it brought, so a replica loses at most its largest own sample per pass:
    # no refinement brings a step's maximum below ``reach``. Steps whose runs cannot end within
    # the slack of the floor are refined only if the greedy split leaves them a chance.
    largest = row_max(r_cost3.reshape(-1, slots)).reshape(r_loads.shape)
    reach = row_max((r_loads - iterations * largest) / w) * (1 - 1e-9)
    # (1 - 1e-12): a greedy maximum summed in another order may round a few ulps below the floor.
    edge = floor * ((1 + _RUNS_SLACK) * (1 - 1e-12))
    _refine_steps(split, np.flatnonzero(reach <= edge), w, floor, iterations, count, threads)
    rest = np.flatnonzero(row_max(r_loads / w) > edge)  # also every step whose reach is above the edge
    if rest.size:
        # Only the chunk's last row may hold padding; the greedy places the real samples alone.
        g_real = rest.size * n - (n - int(count[-1]) if rest[-1] == s - 1 else 0)
        g_out, g_loads = _greedy_split(sid[rest], c[rest], w, slots, count[rest], floor[rest], iterations, g_real,
                                       threads)
        g_max = row_max(g_loads / w)
        chance = (reach[rest] > edge[rest]) & (reach[rest] <= g_max * (1 + _RUNS_SLACK))
        _refine_steps(split, rest[chance], w, floor, iterations, count, threads)
        worse = row_max(r_loads[rest] / w) > g_max * (1 + _RUNS_SLACK)
        out[rest[worse]] = g_out[worse]
    return out


def _refine_steps(split, steps: np.ndarray, w, floor, iterations: int, count, threads: int) -> None:
    """Refine, in place, rows ``steps`` of a split ``(ids, costs, loads, fill)`` (each step on its own)."""
    if steps.size == split[0].shape[0]:
        refine(*split, w, floor, iterations, count, threads)
    elif steps.size:
        part = [a[steps] for a in split]
        refine(*part, w, floor[steps], iterations, count[steps], threads)
        for whole, got in zip(split, part):
            whole[steps] = got


def _greedy_split(sid, c, w, slots: int, count, floor, iterations: int, real: int, threads: int):
    """The greedy split of cost-sorted steps, refined: ``[s, R, slots]`` ids and the loads ``[s, R]``."""
    out, cost3, loads, fill = _place(sid, c, _greedy(c, w, slots, count), w.shape[0], slots, real)
    refine(out, cost3, loads, fill, w, floor, iterations, count, threads)
    return out, loads


def _groups(sizes: np.ndarray, runs: bool) -> list[tuple[int, np.ndarray]]:
    """(width, steps) of each group planned together: all steps, a short last one padded, or per size."""
    if sizes.size and not runs and sizes[-1] > 0 and np.all(sizes[:-1] == sizes[0]) and sizes[-1] <= sizes[0]:
        return [(int(sizes[0]), np.arange(sizes.size))]
    # Runs cut each step by its own length, so steps of other sizes go in groups of their own.
    return [(int(size), np.flatnonzero(sizes == size)) for size in np.unique(sizes)]


def assign_cost(order: np.ndarray, bounds: np.ndarray, slots: int, costs: np.ndarray, weights: np.ndarray,
                iterations: int = 32, runs: bool = False) -> np.ndarray:
    """Cost-balanced split of each step.

    Args:
        order, bounds, slots: as in :func:`evenflow.plan.assign.count.assign_contiguous` (each
            replica's count is free up to ``slots``).
        costs: float64 ``[N]`` cost per sample.
        weights: float64 ``[R]`` relative replica speeds.
        iterations: maximum exchange-refinement passes.

    Returns:
        int64 ``[S, R, slots]``, -1 for padding.
    """
    s_steps, r = bounds.shape[0] - 1, weights.shape[0]
    sizes = np.diff(bounds)
    base = int(bounds[0])
    jobs = []
    for size, steps in _groups(sizes, runs):
        if size == 0:
            jobs.append((0, steps))
            continue
        if r * slots < size:
            raise ValueError(f"cost balancing needs room for every sample of a step: {r} replicas x {slots} slots "
                             f"< {size} samples; pass slots >= {-(-size // r)}")
        # At most _CHUNK_SAMPLES per chunk, and one chunk per core where chunks stay large enough
        # for numpy's loops (which release the GIL) to outweigh Python's per-call overhead.
        per_core = max(-(-steps.size // cores()), _PARALLEL_MIN // size)
        chunk = max(1, min(_CHUNK_SAMPLES // size, per_core))
        jobs += [(size, steps[lo:lo + chunk]) for lo in range(0, steps.size, chunk)]

    def plan_chunk(job) -> np.ndarray:
        size, part = job
        if size == 0:
            return np.full((part.size, r, slots), -1, dtype=np.int64)
        lo, hi = int(bounds[part[0]]) - base, int(bounds[part[-1] + 1]) - base
        if hi - lo == int(sizes[part].sum()) and part[-1] - part[0] == part.size - 1:  # back to back
            if hi - lo == part.size * size:
                sid = order[lo:hi].reshape(part.size, size)
            else:  # a short last step, padded with -1
                sid = np.full(part.size * size, -1, dtype=np.int64)
                sid[:hi - lo] = order[lo:hi]
                sid = sid.reshape(part.size, size)
        else:
            sid = order[(bounds[part] - base)[:, None] + np.arange(size)[None, :]]
        return _split_steps(sid, sizes[part], slots, costs, weights, iterations, runs, inner)

    # Chunks are independent and numpy releases the GIL in its loops: plan them on every core.
    workers = min(len(jobs), cores()) if int(bounds[-1]) - base >= 2 * _PARALLEL_MIN else 1
    inner = cores() if workers == 1 else 1  # one chunk at a time: its refinement uses the cores
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(plan_chunk, jobs))
    else:
        parts = [plan_chunk(job) for job in jobs]
    if len(jobs) == 1 and jobs[0][1].size == s_steps:
        return parts[0]
    ids = np.empty((s_steps, r, slots), dtype=np.int64)
    for (_, part), got in zip(jobs, parts):
        ids[part] = got
    return ids
