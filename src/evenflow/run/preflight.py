"""Checks before the first step, so a bad setup fails with a reason instead of a hang or a silent wrong result.

* :func:`check_plan` (numpy only): every replica must be able to get samples — a
  dataset with fewer samples than replicas leaves some replicas nothing to train on
  in every step. A weight so small that a replica gets no sample of a full step is
  refused by :class:`~evenflow.plan.plan.Plan` itself, with the weight it needs.
* :func:`check_workers_agree`: every worker of a multi-worker run must plan the same
  way *and* load the same data, or the workers would train on overlapping or missing
  samples, or on different samples under the same ids, without any error. Each worker
  contributes one row to one all-gather: its plan's fingerprint (dataset index, global
  batch size, seed, options; hashed), its seed, its sample count, its global batch
  size and its data identity (:func:`~evenflow.data.identity.data_identity`: content,
  keys, per-sample shape, held-out split). A mismatch fails on every worker alike,
  naming which of the two differs and which workers agree among themselves.
  The framework adapters run it as soon as the workers are connected and before the
  model is built: building a model whose input shape follows the data is itself a
  collective that fails, or hangs, on workers whose feature shapes differ.

A records directory with fewer shard files than workers is fine: plans are made of
records, not of files, so every worker still reads exactly its own samples.
"""
from __future__ import annotations

import hashlib

import numpy as np

from evenflow.plan.plan import Plan

# What to do when workers loaded different data (the last words of the error).
DATA_FIX = "start every worker on the same --dataset (same files, keys, split)"

_UNKNOWN = -1.0  # a chunk of "no data identity" (never a chunk of a digest, which is >= 0)


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


def identity_chunks(identity: str | None) -> np.ndarray:
    """float64 ``[3]``: a data identity's 128 bits as 48 + 48 + 32-bit integers (each exact in float64).

    A 32-hex-digit digest is split as it is (so the first chunk, written in hex, is its first
    12 digits); any other string is hashed to 128 bits first; None gives ``-1`` three times.
    """
    if identity is None:
        return np.full(3, _UNKNOWN)
    text = identity.lower()
    if len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
        text = hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()
    return np.array([int(text[:12], 16), int(text[12:24], 16), int(text[24:], 16)], np.float64)


def _shown(chunks) -> str:
    """The first 12 hex digits of a data identity from its chunks (as ``meta.json``'s digest starts)."""
    return "none" if chunks[0] == _UNKNOWN else f"{int(chunks[0]):012x}"


def _groups(rows: np.ndarray) -> list[list[int]]:
    """Workers grouped by equal rows, in order of their first member."""
    found: dict[tuple, list[int]] = {}
    for w, row in enumerate(rows):
        found.setdefault(tuple(row.tolist()), []).append(w)
    return list(found.values())


def check_workers_agree(gather, plan: Plan, local_replicas: int, workers: int, identity: str | None = None) -> None:
    """All-gather :func:`plan_vector` and the data identity across workers; ValueError naming the difference.

    One collective carries both. The error says whether the plans, the data or both differ:
    for plans, the values of worker 0 and of the first worker that differs, and the groups of
    workers that agree among themselves; for data, each group's digest (its first 12 hex
    digits, as ``meta.json`` and ``summary.json`` hold it) and its workers. Every worker sees
    the same rows, so every worker raises the same error.

    Args:
        gather: ``fn(float64 [local replicas, k]) -> [all replicas, k]`` (an all-gather of the framework's strategy or process group);
            a collective: every worker must call this at the same point.
        plan: this worker's training plan.
        local_replicas: replicas of this worker.
        workers: number of workers; 1 returns at once.
        identity: this worker's data identity (``LoadedData.identity``), or None when it has none.
    """
    if workers <= 1:
        return
    mine = np.concatenate([plan_vector(plan), identity_chunks(identity)])
    rows = np.asarray(gather(np.tile(mine, (local_replicas, 1))))[::local_replicas]  # one row per worker
    plans, data = rows[:, :4], rows[:, 4:]
    plan_groups, data_groups = _groups(plans), _groups(data)
    if len(plan_groups) == 1 and len(data_groups) == 1:
        return
    parts = []
    if len(plan_groups) > 1:
        w = plan_groups[1][0]
        names = ("plan fingerprint", "seed", "number of training samples", "global batch size")
        what = [f"{name} {int(plans[0][i])} on worker 0 but {int(plans[w][i])} on worker {w}"
                for i, name in enumerate(names) if plans[0][i] != plans[w][i]]
        parts.append(f"would plan differently ({'; '.join(what)}; agreeing groups: {_listed(plan_groups)})")
    if len(data_groups) > 1:
        shown = ", ".join(f"{_shown(data[g[0]])} on workers {g}" for g in data_groups)
        parts.append(f"loaded different data (data digest {shown}: the dataset's content, its feature or label key, "
                     f"the per-sample shape, the held-out split or the evaluation dataset differ)")
        raise ValueError(f"the workers {' and '.join(parts)}, so they would train one model on different samples "
                         f"under the same ids; {DATA_FIX} and with the same config and flags (evenflow launch does)")
    raise ValueError(f"the workers {parts[0]}, so they would train on overlapping or missing samples; start every "
                     f"worker with the same config, dataset and flags (evenflow launch does)")


def _listed(groups: list[list[int]]) -> str:
    return "; ".join(f"workers {g}" for g in groups)
