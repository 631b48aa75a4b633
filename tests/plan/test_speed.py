"""Speed estimates and rebalancing decisions (numpy only)."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.plan.speed.rebalancer import Rebalancer, RebalanceOptions, SpeedEstimator, feasible_weights, step_imbalance
from evenflow.plan.speed.shares import gain


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


@pytest.mark.parametrize("slow, first_check, count", [(3.0, 10, 2), (1.8, 11, 1)])
def test_a_device_that_slows_later_is_replanned_all_the_way_from_the_updates_after_the_change(slow, first_check,
                                                                                               count):
    # Per-update rows (two per check) at 0.5 s steps; replica 3 slows from update 20, the first
    # update of check 10. Off its line by 200%, two updates show the change (the check right after
    # it); by 80%, three (the next check). Either way the estimate restarts from the updates after
    # the change only, so the re-plan goes all the way, not to a blend of old and new speeds. Made on
    # the few updates since the change (too few before it to be reviewed), it is then refined
    # (RebalanceOptions.refine) where the lines its own steps measure predict a gain over the refining
    # bar (1.05): at 3x they give replica 3 a little less; at 1.8x the first move is within 5% of them.
    a, b = [0.01] * 4, [1e-3] * 4
    reb = Rebalancer(4, RebalanceOptions(review=16, payback=0), global_batch_size=512)
    moves = []
    for k in range(40):
        factor = [1, 1, 1, slow if k >= 10 else 1]
        load, secs = _times(reb.shares, 512, a, b, factor)
        loads, seconds = np.tile(load, (2, 1)), np.tile(secs, (2, 1))
        reb.observe(loads, seconds, seconds.max(axis=1) + 0.002)
        d = reb.check(loads.sum(axis=0), seconds.sum(axis=0), steps_left=1000)
        if d is not None and d.weights is not None:
            moves.append((k, d.reason, d.weights))
    assert moves[0][0] == first_check and moves[0][2][3] == pytest.approx(1 / slow, abs=0.02), moves
    assert [m[1] for m in moves] == ["replan"] * count and reb.undone == 0, moves
    best = best_shares(512, np.asarray(a) * factor, np.asarray(b) * factor)

    def step(shares):
        return _times(shares, 512, a, b, factor)[1].max() + 0.002

    first = np.asarray(moves[0][2]) / np.sum(moves[0][2])
    assert (step(first) / step(best) > RebalanceOptions().refine_threshold) == (count == 2)
    assert step(reb.shares) / step(best) < RebalanceOptions().refine_threshold
    if count == 2:
        assert reb.shares[3] == pytest.approx(best[3], abs=0.01) and reb.shares[3] < first[3]


def test_a_replan_in_a_runs_first_steps_is_not_refined():
    # The same device slow from the start: the first re-plan comes from a run's first updates,
    # where a start-up hiccup is as likely as a slow device, and nothing measured before it can
    # review it. Further moves need the full threshold, which the lines' small gain does not reach.
    reb = Rebalancer(4, RebalanceOptions(review=16, payback=0), global_batch_size=512)
    moves = _run(reb, [0.01] * 4, [1e-3] * 4, [1, 1, 1, 3], g=512, checks=40)
    assert [m[1:] for m in moves] == [("replan", (1.0, 1.0, 1.0, 0.34))], moves


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
    ({"threshold": 1.0}, "threshold must be greater than 1"),
    ({"patience": 0}, "patience must be at least 1"),
    ({"urgent": 1.05}, "urgent must be at least 1.1, got 1.05; urgent is at least threshold"),
    ({"smoothing": 0}, "smoothing must be in"),
    ({"resolution": 0.9}, "resolution must be in"),
    ({"enabled": 1}, "enabled must be true or false"),
])
def test_bad_options_state_the_rule(kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        RebalanceOptions(**kwargs)


def test_a_real_change_of_speed_replaces_the_average_once_two_windows_show_it():
    est = SpeedEstimator(2, smoothing=0.5, jump=0.3)
    est.update([10, 10], [1.0, 1.0])
    assert not est.update([10, 10], [1.1, 3.0]).any()  # +10%: smoothed; x3 once: maybe noise, held out
    np.testing.assert_allclose(est.seconds_per_unit, [0.105, 0.1])
    assert est.update([10, 10], [1.1, 3.0]).tolist() == [False, True]  # x3 again: a new speed, taken as it is
    np.testing.assert_allclose(est.seconds_per_unit, [0.1075, 0.3])
    assert not est.update([10, 10], [1.1, 1.0]).any()  # one window back to x1: not (yet) a change
    np.testing.assert_allclose(est.seconds_per_unit, [0.10875, 0.3])
    assert not est.update([10, 10], [1.1, 3.0]).any()  # x3 again: the lone window off was noise, dropped
    np.testing.assert_allclose(est.seconds_per_unit, [0.109375, 0.3])
    # 40% slower once (held), then 20% slower (more than half a jump, the same way): a change of
    # about the jump's size seen through noise, so both windows are averaged in, in order.
    assert not est.update([10, 10], [1.1, 4.2]).any()
    np.testing.assert_allclose(est.seconds_per_unit[1], 0.3)
    assert not est.update([10, 10], [1.1, 3.6]).any()
    np.testing.assert_allclose(est.seconds_per_unit[1], 0.5 * (0.5 * 0.3 + 0.5 * 0.42) + 0.5 * 0.36)


# -- fixed parts, payback and undo -------------------------------------------------------------
from evenflow.plan.speed.step_model import ReplanReview, StepModel, best_shares  # noqa: E402


def _times(shares, g, a, b, factor):
    """Compute seconds per replica: factor x (a + b x load), the shape of a slowed device."""
    load = np.asarray(shares) * g
    return load, np.asarray(factor) * (np.asarray(a) + np.asarray(b) * load)


def test_the_step_model_separates_the_fixed_part_once_loads_differ():
    model = StepModel(2)
    for _ in range(10):
        model.add(*_times([0.5, 0.5], 64, [0.008, 0.008], [1e-4, 1e-4], [1, 3]))
    a, b, known = model.fit()
    assert not known.any() and b == pytest.approx([0.0112 / 32, 0.0336 / 32])  # the mean rate: a unknown
    for _ in range(4):  # an epoch's last, partial step: 20 samples instead of 64
        model.add(*_times([0.5, 0.5], 20, [0.008, 0.008], [1e-4, 1e-4], [1, 3]))
    a, b, known = model.fit()
    assert known.all()
    np.testing.assert_allclose(a, [0.008, 0.024], rtol=1e-6)
    np.testing.assert_allclose(b, [1e-4, 3e-4], rtol=1e-6)


def test_a_small_load_move_gives_the_line_only_when_steady_steps_measure_it_well():
    rng = np.random.default_rng(0)

    def model_with(noise):
        model = StepModel(1)
        for load in [128] * 8 + [112] * 8:  # a spread of 1.14, under SPREAD
            model.add([load], [0.01 + 0.004 * load + rng.normal(0, noise)])
        return model.fit()

    a, b, known = model_with(0.002)  # steady steps: the slope's error is ~2% of it
    assert known[0] and a[0] == pytest.approx(0.01, abs=0.01) and b[0] == pytest.approx(0.004, rel=0.05)
    a, b, known = model_with(0.05)  # noisy steps (10% of a step): not trusted, the mean rate instead
    assert not known[0] and a[0] == 0.0 and b[0] == pytest.approx(0.52 / 120, rel=0.1)
    for loads in ([128] * 8 + [112], [128] * 4 + [112] * 3):  # steady, but too few rows at a load, or in all
        few = StepModel(1)
        for load in loads:
            few.add([load], [0.01 + 0.004 * load])
        assert not few.fit()[2][0], loads


def test_replicas_whose_loads_barely_moved_borrow_the_fixed_fraction_of_the_measured_ones():
    model = StepModel(3)
    a, b = np.array([0.02, 0.02, 0.04]), np.array([0.001, 0.001, 0.002])  # replica 2: a 2x slow device
    for loads in [[100, 100, 100]] * 8 + [[104, 104, 92]] * 8:  # after a small re-plan
        loads = np.array(loads, float)
        model.add(loads, a + b * loads)
    fa, fb, known = model.fit()
    assert known.all()
    np.testing.assert_allclose([fa[2], fb[2]], [0.04, 0.002], rtol=1e-6)  # measured: its load moved 8%
    # Replicas whose loads never moved take replica 2's fixed fraction of their own step time.
    still = StepModel(3)
    for loads in [[100, 100, 100]] * 8 + [[100, 100, 80]] * 8:
        loads = np.array(loads, float)
        still.add(loads, a + b * loads)
    fa, fb, known = still.fit()
    assert known.all()
    fraction = 0.04 / (0.04 + 0.002 * 80)  # replica 2's fixed part at its latest load: 0.2
    np.testing.assert_allclose(fa[:2], fraction * 0.12, rtol=1e-6)  # 0.12 s per step at load 100
    np.testing.assert_allclose(fb[:2], (1 - fraction) * 0.12 / 100, rtol=1e-6)
    assert not StepModel(3).fit()[2].any()


def test_best_shares_equalise_the_lines_and_starve_a_replica_whose_fixed_part_is_too_slow():
    shares = best_shares(100, np.zeros(4), np.array([1.0, 1.0, 1.0, 2.0]))
    np.testing.assert_allclose(shares, np.array([2, 2, 2, 1]) / 7)
    shares = best_shares(10, np.array([0.0, 0.0, 50.0]), np.array([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(shares, [0.5, 0.5, 0.0])


def _run(reb, a, b, factor, g=64, checks=30, steps_left=1000, overhead=0.002, per=2):
    """Feed ``checks`` windows of ``per`` updates measured under the rebalancer's current weights."""
    moves = []
    for k in range(checks):
        load, secs = _times(reb.shares, g, a, b, factor)
        loads, seconds = np.tile(load, (per, 1)), np.tile(secs, (per, 1))
        reb.observe(loads, seconds, seconds.max(axis=1) + overhead)
        d = reb.check(loads.sum(axis=0), seconds.sum(axis=0), steps_left=steps_left - k * per)
        if d is not None and d.weights is not None:
            moves.append((k, d.reason, d.weights))
    return moves


def test_a_replan_that_changed_nothing_is_kept_and_not_followed_by_others():
    # Every replica's step is 8 ms whatever its batch plus 0.01 ms per sample; replica 3 is 3x slow.
    # Time proportional to load predicts a 2x faster step from giving replica 3 a third of the
    # work; in truth its fixed 24 ms dominates. The move changes the step by less than timing
    # noise (never for the worse), and its steps measure the lines, which then predict too little
    # to move again.
    reb = Rebalancer(4, RebalanceOptions(review=4, payback=0), global_batch_size=64)
    moves = _run(reb, [0.008] * 4, [1e-5] * 4, [1, 1, 1, 3])
    assert moves == [(0, "replan", (1.0, 1.0, 1.0, 0.34))] and reb.undone == 0, moves
    before, after = (_times(shares, 64, [0.008] * 4, [1e-5] * 4, [1, 1, 1, 3])[1].max()
                     for shares in (np.full(4, 0.25), reb.shares))
    assert after <= before


@pytest.mark.parametrize("seed", range(40))
def test_the_first_move_from_equal_loads_never_makes_the_replicas_compute_slower(seed):
    # Lines a_r + b_r * load with any fixed parts a_r >= 0, seen only at equal loads (so taken as
    # proportional to load): the proposed split's slowest replica is never slower than before.
    rng = np.random.default_rng(seed)
    r = int(rng.integers(2, 9))
    a = rng.uniform(0, 0.05, r) * rng.integers(0, 2, r)  # some replicas without a fixed part
    b = rng.uniform(1e-4, 1e-3, r) * rng.choice([1, 1, 2, 5], r)
    g = int(rng.integers(8 * r, 512))
    reb = Rebalancer(r, RebalanceOptions(patience=1, threshold=1.0001, payback=0), global_batch_size=g)
    equal = np.full(r, 1 / r)
    d = reb.check(*_times(np.tile(equal, (2, 1)).sum(axis=0) / 2, 2 * g, 2 * a, b, np.ones(r)))
    assert d is not None
    new = equal if d.weights is None else np.asarray(d.weights) / np.sum(d.weights)
    before, after = (_times(shares, g, a, b, np.ones(r))[1].max() for shares in (equal, new))
    assert after <= before * (1 + 1e-9), (a, b, d)


def test_a_replan_that_pays_is_kept_and_the_first_move_goes_all_the_way():
    reb = Rebalancer(4, RebalanceOptions(review=4, payback=0), global_batch_size=64)
    moves = _run(reb, [0.0005] * 4, [1e-3] * 4, [1, 1, 1, 2])
    # Equal loads so far: time taken as proportional to load proposes 0.5 for replica 3, which
    # its small fixed part barely changes; the move made steps faster and is kept.
    assert [m[1] for m in moves] == ["replan"], moves
    assert moves[0][2][3] == pytest.approx(0.5, abs=0.02) and reb.undone == 0, moves


def _superlinear(load, d=16):
    """Replica 1 is 2x slow per sample; replica 0's time grows faster than its load above 32
    samples (a cache that no longer holds its batch), which lines fitted at loads <= 32 miss."""
    n0, n1 = load
    return np.array([1e-3 * n0 * (1 + max(0.0, n0 - 32) / d), 2e-3 * n1])


def _run_superlinear(reb, d, checks=40, at=None):
    moves = []
    for k in range(checks):
        load = reb.shares * (20 if k == 0 else 64)  # an epoch's last, partial step first: lines known
        secs = _superlinear(load, d)
        loads, seconds = np.tile(load, (2, 1)), np.tile(secs, (2, 1))
        reb.observe(loads, seconds, seconds.max(axis=1) + 0.002)
        d_ = reb.check(loads.sum(axis=0), seconds.sum(axis=0), steps_left=1000)
        if d_ is not None and d_.weights is not None:
            moves.append((d_.reason, d_.weights))
            if at is not None:
                at.append(k)
    return moves


def test_a_replan_that_made_steps_slower_is_undone_when_it_cannot_be_reaimed():
    # evidence=1: the re-plan comes at the patience check, so its review (4 updates) ends before
    # the change detector (3 updates off the lines) takes replica 0's time at its new load for a
    # change of speed, which would start the measurements again instead.
    reb = Rebalancer(2, RebalanceOptions(review=4, payback=0, urgent=10, patience=3, corrections=0, evidence=1),
                     global_batch_size=64)
    at = []
    moves = _run_superlinear(reb, 8, checks=60, at=at)
    # Undone; the linear lines cannot see the cache effect and propose again after 4 checks of
    # rest, then after 8: the rests double, so a wrong model costs ever fewer steps.
    assert [m[0] for m in moves[:6]] == ["replan", "undo"] * 3 and moves[1][1] == (1.0, 1.0), moves
    assert reb.undone >= 3
    rests = [at[2] - at[1], at[4] - at[3]]  # checks from an undo to the next re-plan
    assert rests[1] >= rests[0] + 4, (at, moves)


def test_a_replan_that_missed_is_reaimed_from_the_lines_its_steps_measured():
    reb = Rebalancer(2, RebalanceOptions(review=4, payback=0, urgent=10, patience=3), global_batch_size=64)
    moves = _run_superlinear(reb, 16)
    assert [m[0] for m in moves] == ["replan", "correct"], moves
    equal = _superlinear(np.array([32.0, 32.0])).max()
    assert moves[0][1] == (1.0, 0.5) and _superlinear(np.array([128 / 3, 64 / 3])).max() > equal  # it missed
    assert 0.6 < moves[1][1][1] < 0.8, moves
    assert _superlinear(reb.shares * 64).max() < 0.9 * equal  # re-aimed: faster than equal shares
    assert reb.undone == 0


def test_a_gain_that_cannot_repay_the_replan_over_the_steps_left_is_not_taken():
    reb = Rebalancer(4, RebalanceOptions(), global_batch_size=64)
    reb.replan_cost(0.5)  # half a second to rebuild and refill the pipelines
    # 2x slow on 20 ms steps: a half-way move saves ~5 ms per step, 0.5 s over 100 steps < 1.5 x 0.5 s.
    assert _run(reb, [0.0005] * 4, [3e-4] * 4, [1, 1, 1, 2], steps_left=100) == []
    assert reb.held_back > 0
    reb = Rebalancer(4, RebalanceOptions(), global_batch_size=64)
    reb.replan_cost(0.5)
    moves = _run(reb, [0.0005] * 4, [3e-4] * 4, [1, 1, 1, 2], steps_left=2000)
    assert {m[1] for m in moves} == {"replan"} and moves[-1][2][3] == pytest.approx(0.5, abs=0.06), moves


def _bound_run(reb, a, b, factor, step, g=512, checks=30):
    """Like :func:`_run`, with every update's step taking ``step`` seconds whatever the split (a
    step bound by something outside the replicas' compute): a re-plan measures as no faster."""
    moves = []
    for k in range(checks):
        load, secs = _times(reb.shares, g, a, b, factor)
        loads, seconds = np.tile(load, (2, 1)), np.tile(secs, (2, 1))
        reb.observe(loads, seconds, np.full(2, step))
        d = reb.check(loads.sum(axis=0), seconds.sum(axis=0), steps_left=1000)
        if d is not None and d.weights is not None:
            moves.append((k, d.reason, d.weights))
    return moves


@pytest.mark.parametrize("refine", [0.5, 1.0])
def test_after_a_replan_that_paid_a_smaller_move_refines_it_from_the_measured_lines(refine):
    # Replica 3 is 3x slow in its fixed part and per sample. From equal loads, time taken as
    # proportional to load gives it 1/3 of a fast replica's weight; that re-plan pays, and its
    # steps measure the lines, by which 0.3 is best: 9% faster steps, under the 10% threshold
    # and over the refining one (1.05). With refine=1 every move needs the full threshold.
    a, b, factor = [0.01] * 4, [1e-3] * 4, [1, 1, 1, 3]
    reb = Rebalancer(4, RebalanceOptions(review=4, payback=0, refine=refine), global_batch_size=512)
    moves = _run(reb, a, b, factor, g=512)
    assert moves[0][1:] == ("replan", (1.0, 1.0, 1.0, 0.34)), moves
    if refine == 1.0:
        assert len(moves) == 1, moves
        return
    best = best_shares(512, np.asarray(a) * factor, np.asarray(b) * factor)
    assert [m[1] for m in moves] == ["replan", "replan"] and reb.undone == 0, moves
    assert reb.shares[3] == pytest.approx(best[3], abs=0.01), (moves, best)
    first, last = (_times(np.asarray(w) / np.sum(w), 512, a, b, factor)[1].max() for w in (moves[0][2], reb.weights))
    assert first / last > RebalanceOptions().refine_threshold


def test_a_replan_measured_no_faster_leaves_further_moves_to_the_full_threshold():
    # The same lines, but every step takes 0.3 s whatever the split: the first re-plan (urgent)
    # measures as even, and the lines' 9% predicted gain does not move the plan again.
    reb = Rebalancer(4, RebalanceOptions(review=4, payback=0), global_batch_size=512)
    moves = _bound_run(reb, [0.01] * 4, [1e-3] * 4, [1, 1, 1, 3], step=0.3)
    assert [m[1:] for m in moves] == [("replan", (1.0, 1.0, 1.0, 0.34))], moves


def test_refine_is_a_fraction_of_the_thresholds_margin():
    assert RebalanceOptions().refine_threshold == pytest.approx(1.05)
    assert RebalanceOptions(threshold=1.3, urgent=1.5, refine=0.2).refine_threshold == pytest.approx(1.06)
    for bad in (0, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="refine must be (in|a number)"):
            RebalanceOptions(refine=bad)


def test_a_refining_move_that_measured_slower_is_undone_without_holding_back_the_next_replan():
    # Replica 3 is 3x slow: the first re-plan (0.34, after 5 checks: enough steps before it to be
    # reviewed) pays, the lines then refine it to 0.3. Its steps are made to measure 20% slower, so
    # it is undone. Replica 3 then slows to 3.9x (30%: no change of speed by the detector's
    # measure), a gain over the threshold once its lines catch up: a re-plan follows. An undone
    # re-plan made at the threshold holds further ones back for `review` (16) checks; a refining
    # move predicted less than the threshold, so its undo does not.
    reb = Rebalancer(4, RebalanceOptions(review=16, payback=0, urgent=10, patience=5), global_batch_size=512)
    a, b, factor, moves = [0.01] * 4, [1e-3] * 4, [1, 1, 1, 3], []
    for k in range(80):
        load, secs = _times(reb.shares, 512, a, b, factor)
        loads, seconds = np.tile(load, (2, 1)), np.tile(secs, (2, 1))
        slower = 1.2 if [m[1] for m in moves] == ["replan", "replan"] else 1.0
        reb.observe(loads, seconds, (seconds.max(axis=1) + 0.002) * slower)
        d = reb.check(loads.sum(axis=0), seconds.sum(axis=0), steps_left=1000)
        if d is not None and d.weights is not None:
            moves.append((k, d.reason, d.weights))
            if d.reason == "undo":
                factor = [1, 1, 1, 3.9]
                assert reb._blocked == 0  # the checks that follow may re-plan at the threshold
    reasons = [m[1] for m in moves]
    assert reasons[:4] == ["replan", "replan", "undo", "replan"], moves
    assert moves[1][2][3] < moves[0][2][3], moves
    assert moves[3][2][3] < moves[0][2][3] and reb.undone == 1, moves
