"""Tests of the contiguous-runs split (src/evenflow/plan/assign/runs.py)."""
import numpy as np
import pytest

from evenflow.plan.assign.runs import _clip_cuts, runs_split


def _clip_one_by_one(cuts, n, slots, one):
    r = cuts.shape[1] - 1
    for j in range(1, r):
        low = np.maximum(cuts[:, j - 1] + one, n - slots * (r - j))
        high = np.minimum(cuts[:, j - 1] + slots, n - one * (r - j))
        cuts[:, j] = np.clip(cuts[:, j], low, high)


@pytest.mark.parametrize("r,n,slots", [(2, 10, 6), (8, 64, 10), (8, 64, 8), (16, 40, 4), (5, 3, 1), (1, 7, 7)])
def test_clipping_all_cuts_at_once_equals_clipping_them_left_to_right(r, n, slots):
    # Cuts that are mostly within bounds (the shortcut applies) and cuts pushed out of them
    # from a random column on (the left-to-right pass must run from there).
    rng = np.random.default_rng(r * 1000 + n)
    one = 1 if n >= r else 0
    for trial in range(200):
        inner = np.sort(rng.integers(0, n + 1, (6, r - 1)), axis=1)
        if trial % 2:  # even runs, then one cut moved far
            inner = np.broadcast_to(np.arange(1, r) * n // r, (6, r - 1)).copy()
            if r > 1:
                inner[rng.integers(0, 6), rng.integers(0, r - 1)] = rng.integers(0, n + 1)
        cuts = np.concatenate((np.zeros((6, 1), np.int64), inner, np.full((6, 1), n, np.int64)), axis=1)
        want = cuts.copy()
        _clip_one_by_one(want, n, slots, one)
        _clip_cuts(cuts, n, slots, one)
        assert np.array_equal(cuts, want)


@pytest.mark.parametrize("slots", [32, 200])
def test_runs_split_keeps_cost_order_and_every_sample(slots):
    rng = np.random.default_rng(3)
    s, n, r = 4, 200, 8
    c = -np.sort(-rng.lognormal(0, 1, (s, n)), axis=1)
    sid = rng.permutation(s * n).reshape(s, n)
    out, cost3, loads, fill = runs_split(sid, c, np.ones(r), slots)
    for k in range(s):
        got = out[k][out[k] >= 0]  # C order: replica 0's run, then replica 1's, ...
        assert np.array_equal(got, sid[k])
        assert np.allclose(loads[k], cost3[k].sum(axis=1))
    assert np.all((fill >= 1) & (fill <= slots))
    if slots < n:
        return
    # Uncapped, each run ends where the running cost is nearest its share: no replica is off by more than a sample.
    share = c.sum(axis=1, keepdims=True) / r
    assert np.all(np.abs(loads - share) <= c.max(axis=1, keepdims=True) + 1e-9)
