"""Whether the replicas' compute time follows the load the plan balances by cost.

With ``balance="cost"`` the plan evens out each replica's summed cost per step, and the
rebalancer measures each replica's speed per unit of cost: both take time to grow with cost.
Per replica, a least-squares line ``compute = a + b * load`` over the window's updates gives
the per-unit part's share of the mean time, ``b * mean(load) / mean(compute)``: near 1 the load
explains the time, near 0 (or below) the time is a fixed amount per step whatever the load.
When the cost varies a lot between updates and explains little of the time, the cost column
does not predict this run's compute: the rebalancer then sees a fixed time that no move of
cost shortens, and leaves a slow replica alone. numpy only.
"""
from __future__ import annotations

import numpy as np

SPREAD = 1.5      # a load must vary this much (max / min over the updates) for its line to say anything
FOLLOWS = 0.25    # a per-unit share below this: the time does not follow the load
SAMPLES_FOLLOW = 0.5  # ... at or above this: it does
MIN_UPDATES = 8   # updates a window needs for a line


def per_unit_share(load: np.ndarray, compute: np.ndarray) -> float:
    """Median over replicas (``[updates, R]`` arrays) of the per-unit share of compute time.

    Only replicas whose load spreads by :data:`SPREAD` or more count; NaN when none does.
    """
    load, compute = np.asarray(load, np.float64), np.asarray(compute, np.float64)
    shares = []
    for r in range(load.shape[1]):
        x, y = load[:, r], compute[:, r]
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        x, y = x[ok], y[ok]
        if x.size < MIN_UPDATES or x.max() < SPREAD * x.min():
            continue
        slope = np.polyfit(x, y, 1)[0]
        shares.append(float(slope * x.mean() / y.mean()))
    return float(np.median(shares)) if shares else float("nan")


def cost_advice(cost: np.ndarray, samples: np.ndarray, compute: np.ndarray) -> str | None:
    """The advice when compute time does not follow cost (``[updates, R]`` arrays of a cost-balanced run), else None."""
    share = per_unit_share(cost, compute)
    if not share < FOLLOWS:  # NaN (too little spread or too few updates) says nothing
        return None
    by_count = per_unit_share(samples, compute)
    follows = (f"; it follows their sample counts ({by_count:.0%} of it)" if by_count >= SAMPLES_FOLLOW else "")
    return (f"the replicas' compute time does not follow their cost (it ranged {np.min(cost):,.6g}-{np.max(cost):,.6g} "
            f"per update and explains {max(share, 0.0):.0%} of the time{follows}): balancing by cost evens out a "
            f"number that does not predict time, and rebalancing, which measures speed per unit of cost, sees a "
            f"fixed time that no move of cost shortens; balance by count (--balance count), or give costs that grow "
            f"with compute time")
