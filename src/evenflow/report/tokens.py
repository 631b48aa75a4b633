"""Tokens per replica per step, with and without padding, for any batching of variable-length samples.

A replica pads its batch to the batch's longest sample (what
:class:`evenflow.data.TextSource` does), so its work at a step is
``longest * real samples`` tokens, of which ``sum(lengths)`` are real. Per step,
the slowest replica sets the pace: the padded imbalance is the busiest replica's
padded tokens over its fair share of the step's, ``max_r(padded_r / share_r) / total``
(equal weights: ``max / mean``; 1.0 = every replica does its part), the one imbalance
definition of :func:`evenflow.plan.metrics.imbalance`. Token efficiency is real tokens over
padded tokens, the share of compute that is not spent on padding.

The functions take a plain ids array ``[steps, replicas, slots]`` (-1 = padding),
so they measure an evenflow plan and any other batching scheme (``shard`` +
``bucket_by_sequence_length``, random batches) the same way. numpy only.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.metrics import imbalance

# (name, balance, bucket) of the plan modes `evenflow inspect --dataset` compares.
MODES: tuple[tuple[str, str, bool], ...] = (("count", "count", False), ("count+bucket", "count", True),
                                           ("cost", "cost", False), ("cost+bucket", "cost", True))


def token_loads(ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Real and padded tokens per replica per step.

    Args:
        ids: int ``[steps, replicas, slots]`` sample ids, -1 for padding.
        lengths: ``[N]`` tokens per sample.

    Returns:
        ``(real, padded)``, float64 ``[steps, replicas]`` each.
    """
    ids = np.asarray(ids)
    lengths = np.asarray(lengths, dtype=np.float64)
    c = np.where(ids >= 0, lengths[np.maximum(ids, 0)], 0.0)
    real = c.sum(axis=2)
    padded = c.max(axis=2) * (ids >= 0).sum(axis=2)
    return real, padded


def token_summary(ids: np.ndarray, lengths: np.ndarray, shares: np.ndarray | None = None) -> dict:
    """Per-step padded imbalance and token efficiency of a batching, as plain numbers.

    Args:
        shares: each replica's fair share of a step (the topology's weight shares); None: equal.

    Returns:
        ``steps``, ``tokens_per_replica_step`` (mean real tokens per replica per step),
        ``padded_per_replica_step``, ``max_padded_per_step`` (mean over steps of the
        busiest replica's padded tokens), ``padded_imbalance_mean`` / ``padded_imbalance_p99``
        (the padded imbalance per step) and ``token_efficiency``.
    """
    return _summary(*token_loads(ids, lengths), shares)


def _summary(real: np.ndarray, padded: np.ndarray, shares: np.ndarray | None) -> dict:
    """:func:`token_summary` of real and padded tokens ``[steps, replicas]``."""
    imb = imbalance(padded, shares)
    return {"steps": int(real.shape[0]),
            "tokens_per_replica_step": float(real.mean()),
            "padded_per_replica_step": float(padded.mean()),
            "max_padded_per_step": float(padded.max(axis=1).mean()),
            "padded_imbalance_mean": float(imb.mean()),
            "padded_imbalance_p99": float(np.percentile(imb, 99)) if imb.size else 1.0,
            "token_efficiency": float(real.sum() / padded.sum()) if padded.sum() > 0 else 1.0}


def packed_token_summary(ep) -> dict:
    """:func:`token_summary` of a packed epoch plan: every replica computes ``rows x L`` tokens per step."""
    from evenflow.plan.metrics import padded_loads, replica_loads

    # The tokens of each replica's pieces, and its whole batch [rows, L] (a short last step's empty rows too).
    return _summary(replica_loads(ep), padded_loads(ep), ep.topology.shares)


def compare_modes(index, topology, global_batch_size: int, seed: int = 0, epoch: int = 0,
                  bucket_window: int | None = None, pack: int | None = None, packs: int | None = None,
                  steps: tuple[int, int] | None = None) -> list[dict]:
    """:func:`token_summary` of one epoch under each plan mode of :data:`MODES`.

    Args:
        index: an :class:`~evenflow.plan.index.Index` with costs (the lengths).
        topology: the :class:`~evenflow.plan.topology.Topology`.
        bucket_window: steps per sorted window of the bucketed modes (None: the plan's default).
        pack: L for a last row, ``pack L``: the samples packed into rows of L tokens (longer
            ones split), as many packs per step as hold about ``global_batch_size`` samples'
            tokens (or ``packs``); None packs to the longest sample when the costs are token counts.
        steps: ``(first, last)``: compare steps ``first..last-1`` of the epoch alone, each mode
            planned in proportion to them, and no pack row (a packed plan's steps hold other samples).

    Returns:
        One dict per mode: ``mode`` and the keys of :func:`token_summary`.
    """
    from evenflow.plan import Cursor, Plan

    if index.costs is None:
        raise ValueError("comparing modes needs per-sample lengths (costs) in the index; use a text dataset "
                         "such as builtin:stdlib-docs or pass --costs")
    rows = []
    window = () if steps is None else (Cursor(epoch, steps[0]), Cursor(epoch, steps[1]))
    for name, balance, bucket in MODES:
        plan = Plan(index, topology, global_batch_size=global_batch_size, seed=seed, balance=balance,
                    bucket=bucket,
                    **({"bucket_window": bucket_window} if bucket and bucket_window is not None else {}))
        rows.append({"mode": name, **token_summary(plan.epoch(epoch, *window).ids, index.costs, topology.shares)})
    if steps is not None:
        return rows
    costs = np.asarray(index.costs)
    if pack is None and np.all(costs == np.rint(costs)) and costs.min() >= 1:
        pack = int(costs.max())
    if pack:
        r = topology.replicas
        packs = packs or max(r, int(round(global_batch_size * costs.mean() / pack / r)) * r)
        plan = Plan(index, topology, global_batch_size=packs, seed=seed, balance="cost", pack=pack,
                    pack_overflow="split")
        rows.append({"mode": f"pack {pack}", **packed_token_summary(plan.epoch(epoch))})
    return rows
