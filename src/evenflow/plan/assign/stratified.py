"""Stratified splitting of each step among replicas.

Every replica gets, in every step, within one sample of its proportional share
of every label, and over the epoch within one of its share too:
1. each step's shares are rounded to integers by Ryser's construction, steered
   towards the (label, replica) cells furthest below their share of the epoch so
   far (:mod:`evenflow.plan.assign.stratified_rounding`);
2. where the epoch's steps x classes x replicas counts fit in 2^24 entries, an
   epoch repair then moves samples between replicas inside steps until every
   epoch total is within one of its share (:mod:`evenflow.plan.assign.stratified_repair`).
Every move of the repair keeps each step's class and replica counts, so the
step's id set is untouched, and entries stay within one of each step's share
(they may take ``share - 1`` or ``share + 1`` when the share is a whole number).
The samples of each class are then dealt to replicas by those counts.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.assign.stratified_repair import repair_epoch
from evenflow.plan.assign.stratified_rounding import round_shares

_MAX_REPAIR_ELEMS = 1 << 24  # steps x classes x replicas held dense by the epoch repair


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
        order, bounds, counts, slots: as in :func:`evenflow.plan.assign.count.assign_contiguous`.
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
        x = round_shares(n_c, k_r, target - got[present] - np.floor(share + 1e-9))
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
        repair_epoch(x_all, lo_all, hi_all, seen_c[:, None] * seen_r[None, :] / max(1, seen_r.sum()))
        for s, step, step_codes, present in steps:
            _deal(step, step_codes, present, x_all[s, present], counts[s], ids[s])
    return ids
