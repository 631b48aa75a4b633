"""SpeedRebalancer: the torch trainer's rebalance callback with the TF path's estimator and hysteresis."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from evenflow.plan import Cursor  # noqa: E402
from evenflow.plan.speed import RebalanceOptions  # noqa: E402
from evenflow.torch import SpeedRebalancer, Timings  # noqa: E402


def _window(step, samples, forward, data=None, weights=None):
    samples = np.asarray(samples, np.float64)
    forward = np.asarray(forward, np.float64)
    data = np.zeros_like(forward) if data is None else np.asarray(data, np.float64)
    return Timings(cursor=Cursor(0, step), weights=weights, samples=samples, forward_seconds=forward,
                   step_seconds=forward + data + 0.01, data_seconds=data)


def test_a_half_speed_rank_gets_half_the_weight_after_the_patience_windows():
    cb = SpeedRebalancer(2, 64)
    got = [cb(_window(s, [32, 32], [0.032, 0.064])) for s in range(4)]
    # Predicted speed-up 1.5 (64 ms per step at 32/32, 43 ms at 43/21): above 1.10 at two windows in a row
    # (patience 2) but not above 1.5 (urgent), so the second window re-plans.
    assert got[0] is None and got[1] == pytest.approx((1.0, 0.5))
    assert got[2] is None and got[3] is None  # cool-down, then the weights in use are already the best
    assert cb.decisions[1].gain == pytest.approx(1.5, rel=1e-6)


def test_noise_never_replans_and_data_wait_counts_as_the_ranks_time():
    rng = np.random.default_rng(0)
    cb = SpeedRebalancer(4, 128)
    for s in range(200):
        assert cb(_window(s, [32] * 4, 0.032 * (1 + rng.uniform(-0.04, 0.04, 4)))) is None
    cb = SpeedRebalancer(2, 64, RebalanceOptions(urgent=1.2))
    assert cb(_window(0, [32, 32], [0.032, 0.032], data=[0.0, 0.032])) == pytest.approx((1.0, 0.5))


def test_off_measures_but_never_replans():
    cb = SpeedRebalancer(2, 64, RebalanceOptions(enabled=False))
    assert all(cb(_window(s, [32, 32], [0.032, 0.096])) is None for s in range(6))
    assert cb.decisions[-1].gain > 1.5
