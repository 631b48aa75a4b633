"""Every process must run the same plan: a rank that built another one reads other samples.

Each process derives its rows from its own :class:`~evenflow.plan.plan.Plan`, so processes whose
plans differ (a seed taken from the rank, another batch size or index) read some samples twice
and others never, or stop at different steps and break a collective. :func:`check_same_plan`
all-gathers 48 bits of each process's plan fingerprint (one small collective) and refuses, on
every process alike, a run whose processes disagree.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

__all__ = ["check_same_plan"]


def check_same_plan(plan, all_gather: Callable[[np.ndarray], np.ndarray], local_replicas: int,
                    num_processes: int) -> None:
    """Raise ValueError on every process unless all processes' ``plan`` fingerprints are equal.

    ``all_gather`` takes this process's float64 rows ``[local_replicas, k]`` and returns every
    process's, in process order (the loop's collective).
    """
    if num_processes == 1:
        return
    digest = float(int(hashlib.sha256(plan.fingerprint().encode()).hexdigest()[:12], 16))  # 48 bits: exact
    own = np.full((local_replicas, 1), digest)
    seen = all_gather(own)[:, 0].reshape(num_processes, local_replicas)[:, 0]
    if np.all(seen == seen[0]):
        return
    groups: dict[float, list[int]] = {}
    for process, value in enumerate(seen.tolist()):
        groups.setdefault(value, []).append(process)
    described = "; ".join(f"processes {members}" for members in groups.values())
    raise ValueError(f"the processes built different plans ({described} agree among themselves): each one would "
                     f"read other samples, some twice and some never; build the same Plan on every process "
                     f"(the same index, seed, global batch size and options; never a seed from the rank)")
