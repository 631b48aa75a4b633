"""Checks before the first step, so a bad setup fails with a reason instead of a hang or a silent wrong result.

* :func:`check_plan` (numpy only): every replica must be able to get samples — a
  dataset with fewer samples than replicas leaves some replicas nothing to train on
  in every step. A weight so small that a replica gets no sample of a full step is
  refused by :class:`~evenflow.plan.plan.Plan` itself, with the weight it needs.
* :func:`check_workers_agree`: every worker of a multi-worker run must plan the
  same way, or the workers would train on overlapping or missing samples without
  any error. Each worker contributes its plan's fingerprint (dataset, global batch
  size, seed, options; hashed), its seed, its sample count and its global batch
  size to one all-gather; a mismatch fails on every worker with the values side by side.

A records directory with fewer shard files than workers is fine: plans are made of
records, not of files, so every worker still reads exactly its own samples.
"""
from __future__ import annotations

import hashlib

import numpy as np

from evenflow.plan.plan import Plan

__all__ = ["check_plan", "check_workers_agree", "plan_vector"]


def check_plan(plan: Plan, what: str = "training set") -> None:
    """Raise ValueError when the plan cannot give every replica samples."""
    n, r = plan.index.num_samples, plan.topology.replicas
    if n < r:
        raise ValueError(f"the {what} has {n} samples but the run has {r} replicas: some replicas would train on "
                         f"nothing but padding in every step; use at most {n} replicas or a larger dataset")


def plan_vector(plan: Plan) -> np.ndarray:
    """float64 ``[4]``: a 48-bit hash of the plan's fingerprint (exact in float64), seed, N, global batch size."""
    digest = hashlib.blake2b(plan.fingerprint().encode(), digest_size=6).digest()
    o = plan.options
    return np.array([int.from_bytes(digest, "big"), o.seed, plan.index.num_samples, o.global_batch_size],
                    np.float64)


def check_workers_agree(gather, plan: Plan, local_replicas: int, workers: int) -> None:
    """All-gather :func:`plan_vector` across workers and compare; ValueError naming the difference.

    Args:
        gather: ``fn(float64 [local replicas, k]) -> [all replicas, k]`` (``Trainer.gather_rows``);
            a collective: every worker must call this at the same point.
        plan: this worker's training plan.
        local_replicas: replicas of this worker.
        workers: number of workers; 1 returns at once.
    """
    if workers <= 1:
        return
    mine = plan_vector(plan)
    rows = np.asarray(gather(np.tile(mine, (local_replicas, 1))))[::local_replicas]  # one row per worker
    differ = [w for w in range(len(rows)) if not np.array_equal(rows[w], rows[0])]
    if not differ:
        return
    w = differ[0]
    names = ("plan fingerprint", "seed", "number of training samples", "global batch size")
    what = [f"{name} {int(rows[0][i])} on worker 0 but {int(rows[w][i])} on worker {w}"
            for i, name in enumerate(names) if rows[0][i] != rows[w][i]]
    raise ValueError(f"the workers would plan differently ({'; '.join(what)}), so they would train on overlapping "
                     f"or missing samples; start every worker with the same config, dataset and flags "
                     f"(evenflow launch does)")
