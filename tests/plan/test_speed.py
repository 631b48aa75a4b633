"""Speed estimates and rebalancing decisions (numpy only)."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.plan.speed import (Rebalancer, RebalanceOptions, SpeedEstimator, feasible_weights, gain,
                                 step_imbalance)


def _window(shares, seconds_per_sample, g=128, steps=2, noise=0.0, rng=None):
    load = np.asarray(shares) * g * steps
    secs = load * np.asarray(seconds_per_sample)
    if noise:
        secs = secs * (1 + rng.uniform(-noise, noise, size=secs.shape))
    return load, secs


def test_gain_of_one_half_speed_replica_among_four_is_1_75():
    assert gain(np.full(4, 0.25), [1, 1, 1, 2]) == pytest.approx(1.75)
    assert gain(np.array([2, 2, 2, 1]) / 7, [1, 1, 1, 2]) == pytest.approx(1.0)
    assert step_imbalance(np.full(4, 0.25), [1, 1, 1, 2]) == pytest.approx(2 / 1.25)


def test_estimator_keeps_unmeasured_replicas_and_smooths():
    est = SpeedEstimator(3, smoothing=0.5)
    est.update([10, 0, 10], [1.0, 0.0, 2.0])
    assert not est.ready and np.isnan(est.seconds_per_unit[1])
    est.update([10, 10, 10], [3.0, 1.0, 2.0])
    np.testing.assert_allclose(est.seconds_per_unit, [0.2, 0.1, 0.2])
    with pytest.raises(ValueError, match="one entry per replica"):
        est.update([1, 2], [1, 2])


def test_a_moderate_imbalance_waits_for_patience_checks():
    reb = Rebalancer(4, RebalanceOptions(patience=2), global_batch_size=128)
    u = [1e-3, 1e-3, 1e-3, 1.3e-3]
    first = reb.check(*_window(reb.shares, u))
    assert first.weights is None and first.gain == pytest.approx(0.25 * 1.3 * 3.76)  # vs the rounded proposal 1, 1, 1, 0.76
    second = reb.check(*_window(reb.shares, u))
    assert second.weights == (1.0, 1.0, 1.0, 0.76)  # 1 / 1.3 = 0.769 rounded to a multiple of 0.02


def test_a_2x_slow_replica_gets_half_the_weight_at_the_first_check():
    reb = Rebalancer(4, RebalanceOptions(patience=2, urgent=1.5), global_batch_size=128)
    u = [1e-3, 1e-3, 1e-3, 2e-3]
    second = reb.check(*_window(reb.shares, u))  # gain 1.75 > urgent: no need to wait
    assert second.gain == pytest.approx(1.75)
    assert second.weights == (1.0, 1.0, 1.0, 0.5)
    assert second.imbalance_after == pytest.approx(1.0)
    # Balanced now: further checks keep the weights.
    for _ in range(5):
        assert reb.check(*_window(reb.shares, u)).weights is None
    # The plan accepts the weights, and the slow replica's share is about half.
    plan = ef.Plan(ef.Index(1000), ef.Topology(4, reb.weights), global_batch_size=128)
    counts = plan.epoch(0).real_counts[0]
    assert counts[:3].min() / counts[3] == pytest.approx(2, abs=0.1)


def test_timing_noise_below_the_threshold_never_replans():
    rng = np.random.default_rng(0)
    reb = Rebalancer(4, RebalanceOptions(threshold=1.10), global_batch_size=256)
    decisions = [reb.check(*_window(reb.shares, [1e-3] * 4, noise=0.04, rng=rng)) for _ in range(200)]
    assert all(d.weights is None for d in decisions if d is not None)


def test_a_device_that_slows_down_later_is_followed_once_per_change():
    reb = Rebalancer(4, RebalanceOptions(patience=2, cooldown=2, smoothing=0.5), global_batch_size=256)
    changes = []
    for k in range(40):
        u = [1e-3, 1e-3, 1e-3, 1e-3 if k < 20 else 3e-3]
        d = reb.check(*_window(reb.shares, u))
        if d is not None and d.weights is not None:
            changes.append((k, d.weights))
    assert changes, "never re-planned"
    assert 20 <= changes[0][0] <= 24
    assert changes[-1][1][3] == pytest.approx(1 / 3, abs=0.03)
    assert len(changes) <= 3  # hysteresis: a few steps toward 1/3 while the average catches up, not flapping


def test_rebalancing_off_measures_but_never_changes_weights():
    reb = Rebalancer(2, RebalanceOptions(enabled=False), global_batch_size=64)
    for _ in range(5):
        d = reb.check(*_window(reb.shares, [1e-3, 4e-3], g=64))
    assert d.weights is None and d.gain > 2 and reb.weights == (1.0, 1.0)


def test_feasible_weights_keep_every_replica_in_every_step():
    w = feasible_weights(np.array([1.0, 1.0, 1.0, 0.02]), global_batch_size=16)
    assert (w / w.sum())[3] >= 1.5 / 16 - 1e-12
    ep = ef.Plan(ef.Index(160), ef.Topology(4, tuple(w)), global_batch_size=16).epoch(0)
    assert ep.real_counts.min() >= 1


@pytest.mark.parametrize("kwargs, fragment", [
    ({"threshold": 1.0}, "threshold must be a number > 1"),
    ({"patience": 0}, "patience must be an int >= 1"),
    ({"urgent": 1.05}, "urgent must be a number >= threshold"),
    ({"smoothing": 0}, "smoothing must be in"),
    ({"resolution": 0.9}, "resolution must be in"),
    ({"enabled": 1}, "enabled must be True or False"),
])
def test_bad_options_state_the_rule(kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        RebalanceOptions(**kwargs)


def test_a_real_change_of_speed_replaces_the_average_at_once():
    est = SpeedEstimator(2, smoothing=0.5, jump=0.3)
    est.update([10, 10], [1.0, 1.0])
    est.update([10, 10], [1.1, 3.0])  # +10%: smoothed; x3: a new speed, taken as it is
    np.testing.assert_allclose(est.seconds_per_unit, [0.105, 0.3])
