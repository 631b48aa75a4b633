"""Balance metrics of an :class:`~evenflow.plan.plan.EpochPlan`.

* real / padding counts per replica;
* per-step cost imbalance ``max_r(load_r / share_r) / total``: 1.0 is perfect, 2.0
  means the slowest replica does twice its fair part (costs default to 1);
* token efficiency: real cost over padded cost when each replica pads its batch
  to its longest sample (rows of padding are not counted); for a packed plan, real
  tokens over the tokens of every replica's batch ``[rows, L]``;
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


def step_imbalance(ep) -> np.ndarray:
    """float64 ``[num_steps]``: ``max_r(load_r / share_r) / total`` for each step (1.0 is perfect)."""
    loads = replica_loads(ep)
    total = loads.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (loads / ep.topology.shares[None, :]).max(axis=1) / total
    return np.where(total > 0, ratio, 1.0)


def token_efficiency(ep) -> float:
    """Real cost / padded cost, each replica padding its batch to its longest sample."""
    c = _costs_of(ep)
    real = c.sum()
    if ep.pack_length:
        return float(real / (ep.num_steps * ep.replicas * ep.rows * ep.pack_length)) if ep.num_steps else 1.0
    padded = (c.max(axis=2) * ep.real_counts).sum()
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
    """Per-replica counts and step-level balance figures as JSON-ready numbers."""
    real = ep.real_counts
    pad = ep.slots - real
    imb = step_imbalance(ep) if ep.num_steps else np.ones(1)
    dev_step, dev_epoch = label_deviation(ep)
    loads = replica_loads(ep)
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
             "padding": int(pad[:, i].sum()), "cost": float(loads[:, i].sum())}
            for i in range(ep.replicas)
        ],
        "imbalance_mean": float(imb.mean()),
        "imbalance_p99": float(np.percentile(imb, 99)),
        "imbalance_max": float(imb.max()),
        "token_efficiency": token_efficiency(ep),
        "label_deviation_step": dev_step,
        "label_deviation_epoch": dev_epoch,
        **({"pack_length": ep.pack_length, "rows": ep.rows} if ep.pack_length else {}),
    }
