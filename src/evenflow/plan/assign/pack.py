"""A packed epoch: packs in random order, cut into steps, split among replicas, opened into pieces.

Each epoch the layout's places are filled (:func:`~evenflow.plan.pack.fill_layout`), the
packs are shuffled and every ``global_batch_size`` of them form a step — all from (seed,
epoch) alone, so a step's packs, and the samples in them, are the same for every
topology. Each replica gets its weight's share of the step's packs (largest remainder,
as for samples): in equal counts for equal weights, so every replica's batch is
``[rows, L]``. With ``balance="cost"`` the packs are split so every replica's summed pack
cost per unit of weight is as equal as possible, a pack costing its tokens plus
``attention`` times the sum of its pieces' squared lengths (what dense attention inside
each piece costs). A replica's pieces are listed row by row, each row's in the order
they lie in it.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.assign.apportion import replica_counts
from evenflow.plan.assign.cost import assign_cost
from evenflow.plan.assign.count import assign_contiguous
from evenflow.plan.order import epoch_rng, step_bounds
from evenflow.plan.pack import PackLayout, fill_layout

_STREAM_FILL, _STREAM_PACK_ORDER = 5, 6  # beside the streams of evenflow.plan.order


def pack_costs(layout: PackLayout, attention: float) -> np.ndarray:
    """float64 ``[P]``: each pack's tokens plus ``attention`` x the sum of its pieces' squared lengths.

    Pieces of equal length swap places between epochs, so a pack's cost is the same in every epoch.
    """
    lens = layout.place_len[layout.pack_places].astype(np.float64)
    if not lens.size:
        return np.zeros(0)
    return np.add.reduceat(lens + attention * lens * lens, layout.pack_ptr[:-1])


def pack_counts(num_packs: int, global_batch_size: int, drop_remainder: bool, shares) -> np.ndarray:
    """int64 ``[S, R]``: packs per replica in each step of an epoch."""
    return replica_counts(np.diff(step_bounds(num_packs, global_batch_size, drop_remainder)), np.asarray(shares))


def _open_packs(packs: np.ndarray, layout: PackLayout, piece_at: np.ndarray, width: int):
    """Pieces of ``packs`` ``[S, R, rows]`` (-1 = empty row) as ``[S, R, width]`` sample, start and row arrays."""
    s, r, rows = packs.shape
    flat = packs.reshape(-1)
    cells = np.flatnonzero(flat >= 0)
    size = layout.pack_sizes[flat[cells]]
    total = int(size.sum())
    cell_of = np.repeat(cells, size)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(size) - size, size)
    piece = piece_at[layout.pack_places[layout.pack_ptr[flat[cell_of]] + within]]
    group = cell_of // rows  # (step, replica)
    first_of_group = np.searchsorted(group, group, side="left")
    slot = np.arange(total, dtype=np.int64) - first_of_group
    ids = np.full((s * r, width), -1, np.int64)
    starts = np.zeros((s * r, width), np.int64)
    row = np.full((s * r, width), -1, np.int64)
    ids[group, slot] = layout.sample[piece]
    starts[group, slot] = layout.start[piece]
    row[group, slot] = cell_of % rows
    return ids.reshape(s, r, width), starts.reshape(s, r, width), row.reshape(s, r, width)


def _split_count(packs, bounds, counts, rows: int, costs, shares) -> np.ndarray:
    return assign_contiguous(packs, bounds, counts, rows)


def _split_cost(packs, bounds, counts, rows: int, costs, shares) -> np.ndarray:
    return assign_cost(packs, bounds, rows, costs, shares)


# PlanOptions.balance -> how a packed plan splits each step's packs (int64 [S, R, rows] of pack ids).
PACK_SPLITS = {"count": _split_count, "cost": _split_cost}


def packed_epoch(layout: PackLayout, options, shares, epoch: int, first: int, rows: int, width: int,
                 costs: np.ndarray | None = None):
    """Steps ``first..`` of epoch ``epoch``: ``(ids, starts, rows)``, each int64 ``[S, R, width]``.

    Args:
        layout: the dataset's :class:`~evenflow.plan.pack.PackLayout`.
        options: the plan's options (seed, global batch size, balance, drop_remainder).
        shares: float ``[R]`` replica shares summing to 1.
        epoch, first: the epoch and its first step to plan.
        rows: packs per replica batch, at least any replica's count.
        width: pieces per replica batch, at least any replica's count.
        costs: :func:`pack_costs` for ``balance="cost"``.
    """
    piece_at = fill_layout(layout, epoch_rng(options.seed, epoch, _STREAM_FILL))
    order = epoch_rng(options.seed, epoch, _STREAM_PACK_ORDER).permutation(layout.num_packs).astype(np.int64)
    bounds = step_bounds(layout.num_packs, options.global_batch_size, options.drop_remainder)
    counts = pack_counts(layout.num_packs, options.global_batch_size, options.drop_remainder, shares)[first:]
    sub_order, sub_bounds = order[int(bounds[first]):int(bounds[-1])], bounds[first:]
    packs = PACK_SPLITS[options.balance](sub_order, sub_bounds, counts, rows, costs, np.asarray(shares))
    return _open_packs(packs, layout, piece_at, width)
