"""The rows of a window of steps: ``[steps, replicas, slots]``, or one replica's ``[steps, slots]``.

A window is planned from the epoch's order (:class:`~evenflow.plan.order.EpochOrder`) alone:
its steps' samples, and the replica counts of its steps (:class:`~evenflow.plan.steps.StepGrid`,
in closed form). What a window costs depends on the mode:

* count: the window's samples; one replica's rows alone read only that replica's positions;
* cost: the window's samples (every replica's split depends on the whole step);
* bucket: the bucket windows its steps come from;
* stratified with count balance: the whole epoch (each replica's label counts are kept
  within one of their share over the epoch, which carries state from step to step).
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.assign.cost import assign_cost
from evenflow.plan.assign.count import assign_contiguous
from evenflow.plan.assign.stratified import assign_stratified
from evenflow.plan.memory import check_epoch_fits
from evenflow.plan.scratch import keep_scratch


def check_window(grid, options, first: int, last: int) -> None:
    """Raise ``ValueError`` before planning a window that cannot fit in memory (see :mod:`memory`)."""
    if options.stratify:  # the class order (and with count balance the split) of the whole epoch
        check_epoch_fits(grid.used)
    else:
        whole = first == 0 and last == grid.num_steps
        check_epoch_fits(grid.start(last) - grid.start(first), what="an epoch of" if whole else "a window of")


def _count(order, index, options, shares, slots: int, first: int, last: int) -> np.ndarray:
    grid = order.grid
    return assign_contiguous(order.steps(first, last), grid.bounds(first, last), grid.counts(shares, first, last),
                             slots)


def _cost(order, index, options, shares, slots: int, first: int, last: int) -> np.ndarray:
    return assign_cost(order.steps(first, last), order.grid.bounds(first, last), slots, index.cost_or_ones(),
                       np.asarray(shares), runs=options.bucket)


def _stratified(order, index, options, shares, slots: int, first: int, last: int) -> np.ndarray:
    if order.kept is None:  # planned once per epoch, then sliced by every window
        grid = order.grid
        whole = order.steps(0, grid.num_steps)
        order.kept = assign_stratified(whole, grid.bounds(), grid.counts(shares), slots, index.label_codes,
                                       index.num_classes)
    return order.kept[first:last].copy()


# PlanOptions.assignment -> the function that lays out a window's steps among replicas (packed plans have their own:
# evenflow.plan.assign.pack). Each takes (order, index, options, shares, slots, first, last).
ASSIGNMENTS = {"count": _count, "cost": _cost, "stratified": _stratified}


def window_ids(order, index, options, shares: np.ndarray, slots: int, first: int, last: int) -> np.ndarray:
    """int64 ``[last - first, R, slots]``: every replica's rows in steps ``first..last-1``.

    The caller checks the window's size first (:func:`check_window`), before the epoch's order is built.
    """
    keep_scratch()
    return ASSIGNMENTS[options.assignment](order, index, options, shares, slots, first, last)


def replica_rows(order, index, options, shares: np.ndarray, slots: int, replica: int,
                 first: int, last: int) -> np.ndarray:
    """int64 ``[last - first, slots]``: replica ``replica``'s rows in steps ``first..last-1``."""
    if not (order.random_access and options.assignment == "count"):
        return window_ids(order, index, options, shares, slots, first, last)[:, replica].copy()
    grid = order.grid
    counts = grid.counts(shares, first, last)
    mine = counts[:, replica]
    before = counts[:, :replica].sum(axis=1)
    real = np.arange(slots)[None, :] < mine[:, None]
    positions = grid.bounds(first, last)[:-1, None] + before[:, None] + np.arange(slots)[None, :]
    rows = np.full((last - first, slots), -1, dtype=np.int64)
    rows[real] = order.at(positions[real])
    return rows
