"""The per-replica balance table of an epoch plan: real samples, padding slots, label deviation."""
from __future__ import annotations

import numpy as np

from evenflow.plan.plan import EpochPlan


def replica_label_deviation(ep: EpochPlan) -> np.ndarray:
    """float64 ``[replicas]``: per replica, the largest |count - proportional share| of any label over the epoch."""
    if ep.index.labels is None:
        return np.zeros(ep.replicas)
    k = ep.index.num_classes
    lab = np.where(ep.ids >= 0, ep.index.codes_of(np.maximum(ep.ids, 0)), k)   # [S, R, slots], k = padding
    counts = np.stack([np.bincount(lab[:, r].ravel(), minlength=k + 1)[:k] for r in range(ep.replicas)])  # [R, K]
    share = counts.sum(axis=0)[None, :] * counts.sum(axis=1)[:, None] / max(counts.sum(), 1)
    return np.abs(counts - share).max(axis=1)


def balance_table(ep: EpochPlan) -> str:
    """A fixed-width per-replica table: real samples, padding slots, label deviation."""
    summary = ep.summary()
    dev = replica_label_deviation(ep)
    lines = [f"{'replica':>8} {'real':>7} {'padding slots':>14} {'label dev':>10}"]
    for row, d in zip(summary["per_replica"], dev):
        lines.append(f"{row['replica']:>8} {row['real']:>7} {row['padding_slots']:>14} {d:>10.2f}")
    lines.append(f"{'total':>8} {summary['real_samples']:>7} "
                 f"{sum(r['padding_slots'] for r in summary['per_replica']):>14}")
    lines.append(f"label deviation (samples, worst label on worst replica): per step "
                 f"{summary['label_deviation_step']:.2f}, over the epoch {summary['label_deviation_epoch']:.2f}")
    return "\n".join(lines)
