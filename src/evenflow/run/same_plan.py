"""Every process must run the same plan on the same data: a rank that differs reads other samples.

Each process derives its rows from its own :class:`~evenflow.plan.plan.Plan`, so processes whose
plans differ (a seed taken from the rank, another batch size or index) read some samples twice
and others never, or stop at different steps and break a collective; processes whose sources
hold different data (another file with the same labels, another feature shape) train one model
on different samples under the same ids. :func:`check_same_plan` all-gathers 48 bits of each
process's plan fingerprint and the 128 bits of its data identity
(:func:`~evenflow.data.identity.source_identity`) in one small collective, and refuses, on
every process alike, a run whose processes disagree, naming which of the two differs.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

from evenflow.data.identity import source_identity
from evenflow.run.preflight import DATA_FIX, identity_chunks


def check_same_plan(plan, all_gather: Callable[[np.ndarray], np.ndarray], local_replicas: int,
                    num_processes: int, source=None) -> None:
    """Raise ValueError on every process unless all processes' plans and data are equal.

    ``all_gather`` takes this process's float64 rows ``[local_replicas, k]`` and returns every
    process's, in process order (the loop's collective). ``source`` is what the processes read
    (a ``Source``, or a reader with a ``source``); its identity is compared when
    :func:`~evenflow.data.identity.source_identity` knows its kind, else only the plans are.
    """
    if num_processes == 1:
        return
    digest = float(int(hashlib.sha256(plan.fingerprint().encode()).hexdigest()[:12], 16))  # 48 bits: exact
    mine = np.concatenate([[digest], identity_chunks(None if source is None else source_identity(source))])
    seen = all_gather(np.tile(mine, (local_replicas, 1)))[::local_replicas]  # one row per process
    problems = []
    for what, cols in (("plans", slice(0, 1)), ("data", slice(1, 4))):
        groups: dict[tuple, list[int]] = {}
        for process, row in enumerate(seen[:, cols].tolist()):
            groups.setdefault(tuple(row), []).append(process)
        if len(groups) > 1:
            problems.append((what, "; ".join(f"processes {members}" for members in groups.values())))
    if not problems:
        return
    if problems[0][0] == "plans":
        described = problems[0][1]
        also = f"; and they read different data ({problems[1][1]} agree among themselves): {DATA_FIX}" \
            if len(problems) > 1 else ""
        raise ValueError(f"the processes built different plans ({described} agree among themselves): each one would "
                         f"read other samples, some twice and some never; build the same Plan on every process "
                         f"(the same index, seed, global batch size and options; never a seed from the rank){also}")
    raise ValueError(f"the processes read different data ({problems[0][1]} agree among themselves: their sources "
                     f"hold other features or labels under the same sample ids): they would train one model on "
                     f"different samples; give every process the same source (the same arrays, files, keys and "
                     f"split), or {DATA_FIX}")
