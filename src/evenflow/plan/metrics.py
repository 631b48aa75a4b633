"""Balance metrics of an :class:`~evenflow.plan.plan.EpochPlan`.

The figures, each with one definition wherever evenflow shows it (``inspect``, the run report, telemetry):

* **imbalance** of a load, per step: the busiest replica's load over its fair share of the
  step's total, ``max_r(load_r / share_r) / total`` with ``share_r`` the replica's weight
  share (equal weights: ``max / mean``); 1.0 is perfect, 2.0 means one replica does twice its
  fair part. Its name says the load: **cost imbalance** (summed sample cost per replica, here;
  costs default to 1), **padded imbalance** (tokens with padding,
  :mod:`evenflow.report.tokens`), **compute imbalance** (measured compute seconds, where every
  replica's fair share is an equal part of the time, :mod:`evenflow.report.telemetry`);
* **padding slots**: the slots of a replica's steps that hold no sample (-1, masked);
* **token efficiency**: real cost over computed (padded) cost when each replica pads its batch
  to its longest sample (rows of padding are not counted); for a packed plan, real
  tokens over the tokens of every replica's batch ``[rows, L]``. **Padding tokens** are the
  computed tokens that are not real, and the **padding share** is padding tokens over
  computed tokens, ``1 - token efficiency``;
* label deviation: how far a replica's per-label count is from its proportional
  share ``n_c * k_r / n``, per step and over the epoch.
"""
from __future__ import annotations

import numpy as np


def _costs_of(ep) -> np.ndarray:
    c = ep.index.cost_or_ones()[np.maximum(ep.ids, 0)]
    if ep.pack_length:  # a piece of a split sample costs its own tokens
        c = np.minimum(c - ep.starts, ep.pack_length)
    return np.where(ep.ids >= 0, c, 0.0)


def replica_loads(ep) -> np.ndarray:
    """float64 ``[num_steps, replicas]``: summed cost per replica per step."""
    return _costs_of(ep).sum(axis=2)


def imbalance(loads: np.ndarray, shares: np.ndarray | None = None) -> np.ndarray:
    """float64 ``[steps]``: each step's imbalance of ``loads`` ``[steps, replicas]``.

    The busiest replica's load over its fair share of the step's total,
    ``max_r(load_r / share_r) / total`` (``shares`` None: equal, so ``max / mean``); 1.0 for a
    step without load.
    """
    loads = np.asarray(loads, dtype=np.float64)
    shares = np.full(loads.shape[1], 1.0 / loads.shape[1]) if shares is None else np.asarray(shares, np.float64)
    total = loads.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (loads / shares[None, :]).max(axis=1) / total
    return np.where(total > 0, ratio, 1.0)


def step_imbalance(ep) -> np.ndarray:
    """float64 ``[num_steps]``: the cost imbalance of each step (:func:`imbalance` of :func:`replica_loads`)."""
    return imbalance(replica_loads(ep), ep.topology.shares)


def padded_loads(ep) -> np.ndarray:
    """float64 ``[num_steps, replicas]``: the cost each replica computes, padding included.

    Each replica pads its batch to its longest sample (``longest * real samples``); a packed
    replica computes its whole batch ``[rows, L]``.
    """
    if ep.pack_length:
        return np.full((ep.num_steps, ep.replicas), float(ep.rows * ep.pack_length))
    return _costs_of(ep).max(axis=2) * ep.real_counts


def token_efficiency(ep) -> float:
    """Real cost / padded cost, each replica padding its batch to its longest sample (packed: ``[rows, L]``)."""
    real, padded = _costs_of(ep).sum(), padded_loads(ep).sum()
    return float(real / padded) if padded > 0 else 1.0


def label_deviation(ep) -> tuple[float, float]:
    """``(per_step, epoch)``: the largest |count - share| of any label on any replica.

    Per step the share of label c for replica r is ``n_c * k_r / n`` with that step's
    counts; over the epoch it uses the epoch's totals. ``(0.0, 0.0)`` without labels.
    """
    if ep.index.labels is None or ep.num_steps == 0:
        return 0.0, 0.0
    k = ep.index.num_classes
    s, r, _ = ep.ids.shape
    mask = ep.ids >= 0
    lab = np.where(mask, ep.index.codes_of(np.maximum(ep.ids, 0)), k)          # k = padding bucket
    cell = (np.arange(s)[:, None, None] * r + np.arange(r)[None, :, None]) * (k + 1) + lab
    x = np.bincount(cell.ravel(), minlength=s * r * (k + 1)).reshape(s, r, k + 1)[:, :, :k]  # [S, R, C]
    n_sc = x.sum(axis=1)                                  # [S, C]
    k_sr = x.sum(axis=2)                                  # [S, R]
    n_s = np.maximum(k_sr.sum(axis=1), 1)
    share = n_sc[:, None, :] * k_sr[:, :, None] / n_s[:, None, None]
    per_step = float(np.abs(x - share).max())
    tot = x.sum(axis=0)                                   # [R, C]
    share_e = tot.sum(axis=0)[None, :] * tot.sum(axis=1)[:, None] / max(tot.sum(), 1)
    return per_step, float(np.abs(tot - share_e).max())


def summarize(ep) -> dict:
    """Per-replica counts and step-level balance figures as JSON-ready numbers.

    ``imbalance_mean`` / ``_p99`` / ``_max`` are of the per-step cost imbalance; per replica,
    ``padding_slots`` counts empty slots and ``padding_tokens`` the computed cost that is not a
    sample's; ``padding_share`` is the padding tokens over all computed tokens (``1 - token_efficiency``).
    """
    real = ep.real_counts
    pad = ep.slots - real
    imb = step_imbalance(ep) if ep.num_steps else np.ones(1)
    dev_step, dev_epoch = label_deviation(ep)
    loads = replica_loads(ep)
    padded = padded_loads(ep)
    pad_tokens, computed = (padded - loads).sum(axis=0), float(padded.sum())  # [R], all computed tokens
    return {
        "epoch": ep.epoch,
        "start_step": ep.start_step,
        "num_steps": ep.num_steps,
        "total_steps": ep.total_steps,
        "replicas": ep.replicas,
        "slots": ep.slots,
        "real_samples": int(real.sum()),
        "per_replica": [
            {"replica": i, "weight": 1.0 if ep.topology.weights is None else ep.topology.weights[i],
             "real": int(real[:, i].sum()),
             "padding_slots": int(pad[:, i].sum()), "cost": float(loads[:, i].sum()),
             "padding_tokens": float(pad_tokens[i])}
            for i in range(ep.replicas)
        ],
        "imbalance_mean": float(imb.mean()),
        "imbalance_p99": float(np.percentile(imb, 99)),
        "imbalance_max": float(imb.max()),
        "token_efficiency": token_efficiency(ep),
        "padding_share": float(pad_tokens.sum() / computed) if computed > 0 else 0.0,
        "label_deviation_step": dev_step,
        "label_deviation_epoch": dev_epoch,
        **({"pack_length": ep.pack_length, "rows": ep.rows} if ep.pack_length else {}),
    }
