"""Lazy plans: any window of steps, or one replica's rows, equals the same slice of the whole epoch."""
import dataclasses
import tracemalloc

import numpy as np
import pytest

import evenflow as ef
from evenflow.testing import assert_exactly_once
from evenflow.plan import shuffle as shuffle_mod
from evenflow.plan.shuffle import EpochShuffle

MODES = {
    "count": {},
    "count weighted": {"weights": (3, 1, 2)},
    "count drop": {"drop_remainder": True},
    "cost": {"balance": "cost"},
    "cost weighted": {"balance": "cost", "weights": (1, 2, 1)},
    "bucket": {"bucket": True, "bucket_window": 3},
    "cost bucket": {"balance": "cost", "bucket": True, "bucket_window": 2},
    "bucket drop": {"bucket": True, "bucket_window": 4, "drop_remainder": True},
    "stratified": {"stratify": True},
    "stratified cost": {"stratify": True, "balance": "cost"},
    "stratified bucket": {"stratify": True, "bucket": True, "bucket_window": 3},
}


@pytest.fixture(params=[False, True], ids=["table", "feistel"])
def feistel(request, monkeypatch):
    # The Feistel network serves datasets over TABLE_MAX samples; lowering the limit runs it here.
    if request.param:
        monkeypatch.setattr(shuffle_mod, "TABLE_MAX", 16)
    return request.param


def _plan(mode: str, n: int = 1003, g: int = 24):
    opts = dict(MODES[mode])
    weights = opts.pop("weights", None)
    rng = np.random.default_rng(7)
    index = ef.Index(num_samples=n, labels=rng.integers(0, 5, n), costs=rng.lognormal(3, 1, n))
    return ef.Plan(index, ef.Topology(replicas=3, weights=weights), global_batch_size=g, seed=11, **opts)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_window_and_every_replica_equals_the_whole_epoch(mode, feistel):
    plan = _plan(mode)
    whole = plan.epoch(2).ids
    s = plan.num_steps
    for a, b in [(0, s), (0, 1), (5, 9), (s - 1, s), (s - 3, s), (17, 17), (s, s)]:
        window = _plan(mode).epoch(2, start=ef.Cursor(2, a), stop=ef.Cursor(2, b))
        assert window.start_step == a and window.num_steps == b - a
        np.testing.assert_array_equal(window.ids, whole[a:b], err_msg=f"{mode} steps {a}..{b}")
        for r in range(3):
            rows = _plan(mode).replica_ids(2, r, start=ef.Cursor(2, a), stop=ef.Cursor(2, b))
            np.testing.assert_array_equal(rows, whole[a:b, r], err_msg=f"{mode} replica {r} steps {a}..{b}")
    if not plan.options.drop_remainder:
        assert_exactly_once(plan, 2)


def test_the_feistel_order_is_a_seeded_bijection_read_anywhere():
    for n in (17, 1000, 4096, 4097, 65_537):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(shuffle_mod, "TABLE_MAX", 1)
            sh = EpochShuffle(n, 5, 1, 1)
            other_epoch, other_seed = EpochShuffle(n, 5, 2, 1), EpochShuffle(n, 6, 1, 1)
        whole = sh.range(0, n)
        assert np.array_equal(np.sort(whole), np.arange(n)), n
        pos = np.random.default_rng(n).integers(0, n, 50)
        assert np.array_equal(sh(pos), whole[pos])
        assert np.array_equal(sh.range(n // 3, n // 2), whole[n // 3: n // 2])
        assert not np.array_equal(other_epoch.range(0, n), whole)
        assert not np.array_equal(other_seed.range(0, n), whole)


def test_the_feistel_order_looks_like_a_shuffle(monkeypatch):
    # No trace of the ids' order in the shuffled order: rank correlation near 0, the first
    # tenth of the ids spread evenly over the order, neighbours not kept together.
    monkeypatch.setattr(shuffle_mod, "TABLE_MAX", 1)
    n = 200_003
    order = EpochShuffle(n, 0, 0, 1).range(0, n)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    rho = np.corrcoef(np.arange(n), position)[0, 1]
    assert abs(rho) < 0.01, rho
    counts = np.bincount(position[: n // 10] * 20 // n, minlength=20)
    expected = n // 10 / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8, (chi2, counts)  # 19 degrees of freedom, p = 0.001
    gaps = np.abs(np.diff(position[:1000]))
    assert np.median(gaps) > n / 8, np.median(gaps)


def test_a_window_of_a_huge_epoch_costs_the_window_only():
    # 10^9 samples cannot be planned whole here (about 24 GB); one window of it can.
    plan = ef.Plan(ef.Index(num_samples=10**9), ef.Topology(replicas=64), global_batch_size=4096, seed=3)
    plan.epoch(0, stop=ef.Cursor(0, 1))  # numpy's first-call allocations, not the window's: run alone they are 0.1 MiB
    tracemalloc.start()
    ep = plan.epoch(1, start=ef.Cursor(1, 1000), stop=ef.Cursor(1, 1002))
    rows = plan.replica_ids(1, 5, start=ef.Cursor(1, 1000), stop=ef.Cursor(1, 1002))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # The whole epoch would take about 24 GB; the window takes its own 8,192 samples.
    assert peak < 2**20, peak
    assert ep.ids.shape == (2, 64, 64) and (ep.ids >= 0).all()
    np.testing.assert_array_equal(rows, ep.ids[:, 5])
    assert np.unique(ep.ids).size == 2 * 4096 and ep.ids.max() < 10**9


@pytest.mark.filterwarnings("ignore:balance='cost' without costs")
def test_a_cost_window_without_costs_allocates_no_column_of_ones():
    # Without costs every sample costs 1: one value broadcast, not N of them (8 GB at 10^9 per window).
    plan = ef.Plan(ef.Index(num_samples=10**9), ef.Topology(replicas=64), global_batch_size=4096, seed=3,
                   balance="cost")
    plan.epoch(0, stop=ef.Cursor(0, 1))
    tracemalloc.start()
    ep = plan.epoch(1, start=ef.Cursor(1, 1000), stop=ef.Cursor(1, 1002))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**22, peak
    assert ep.ids.shape[:2] == (2, 64) and np.unique(ep.ids[ep.ids >= 0]).size == 2 * 4096
    assert ((ep.ids >= 0).sum(axis=2) == 64).all()  # equal costs: equal counts


def test_window_cursors_are_checked():
    plan = _plan("count")
    with pytest.raises(ValueError, match="stop cursor .* before the start"):
        plan.epoch(0, start=ef.Cursor(0, 5), stop=ef.Cursor(0, 4))
    with pytest.raises(ValueError, match="stop cursor is in epoch 1"):
        plan.epoch(0, stop=ef.Cursor(1, 4))
    with pytest.raises(ValueError, match="within the epoch's"):
        plan.epoch(0, stop=ef.Cursor(0, plan.num_steps + 1))
    with pytest.raises(ValueError, match="replica must be at most 2, got 3"):
        plan.replica_ids(0, 3)


@pytest.mark.parametrize("mode", ["count", "cost weighted", "stratified"])
def test_the_torch_sampler_reads_windows_that_equal_the_whole_epochs(mode, monkeypatch):
    pytest.importorskip("torch")
    from evenflow.plan import epoch_rows
    from evenflow.torch import loader

    monkeypatch.setattr(epoch_rows, "WINDOW_SAMPLES", 100)  # 4 steps of 24 per window
    plan = _plan(mode)
    start = ef.Cursor(1, 7)
    for rank in range(3):
        keys = list(loader.PlanSteps(plan, rank, start=start, epochs=3))
        want = [(e, s, plan.epoch(e).ids[s, rank], plan.epoch(e).global_real_counts[s])
                for e in (1, 2) for s in range(7 if e == 1 else 0, plan.num_steps)]
        assert len(keys) == len(want)
        for (e, s, ids, count, packing), (we, ws, wids, wcount) in zip(keys, want):
            assert (e, s, count, packing) == (we, ws, wcount, None)
            np.testing.assert_array_equal(ids, wids)


@pytest.mark.parametrize("mode", ["count", "count weighted", "count drop", "cost weighted", "stratified cost"])
def test_the_tensorflow_rows_of_a_replica_are_planned_alone_and_equal_the_epochs(mode, monkeypatch):
    # Count mode: any replica's rows, window by window. Cost mode: a worker's range of replicas
    # (asked once per epoch), window by window; its single replicas share one planned epoch.
    from evenflow.plan import epoch_rows

    monkeypatch.setattr(epoch_rows, "WINDOW_SAMPLES", 100)  # windows of 4 steps of 24
    plan = _plan(mode)
    rows = epoch_rows.EpochRows(plan, ef.Cursor(1, 5))
    asked = (0, 2, range(0, 3), range(1, 3)) if mode.startswith("count") else (range(0, 3), range(1, 3))
    for epoch, first in ((1, 5), (2, 0)):
        ep = plan.epoch(epoch, start=ef.Cursor(epoch, first))
        for replica in asked:
            ids, counts = rows.rows(epoch, replica)
            if isinstance(replica, int):
                want_ids, want_counts = ep.ids[:, replica], ep.global_real_counts
            else:
                want_ids = ep.ids[:, replica.start:replica.stop].reshape(-1, plan.slots)
                want_counts = np.repeat(ep.global_real_counts, len(replica))
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(counts, want_counts)
    assert not rows._cache  # no whole epoch was planned


def test_a_subclass_that_plans_its_own_epochs_is_read_through_them():
    class Reversed(ef.Plan):
        def epoch(self, epoch, start=None, stop=None):
            ep = super().epoch(epoch, start, stop)
            return dataclasses.replace(ep, ids=ep.ids[:, ::-1].copy())

    plan = _plan("count")
    assert plan.windowed and not Reversed(plan.index, plan.topology, options=plan.options).windowed


@pytest.mark.parametrize("weights", [None, (3, 1, 2), (1, 1, 1, 1, 5)])
@pytest.mark.parametrize("n,g", [(1003, 24), (960, 24), (7, 5), (100, 100)])
def test_the_step_grid_gives_the_counts_of_the_whole_epoch_for_any_window(weights, n, g):
    from evenflow.plan.assign.apportion import replica_counts
    from evenflow.plan.order import step_bounds
    from evenflow.plan.steps import StepGrid

    shares = ef.Topology(replicas=len(weights) if weights else 3, weights=weights).shares
    for drop in (False, True):
        if drop and n < g:
            continue
        bounds = step_bounds(n, g, drop)
        sizes = np.diff(bounds)
        grid = StepGrid(n, g, drop)
        whole = replica_counts(sizes, shares)
        np.testing.assert_array_equal(grid.bounds(), bounds)
        np.testing.assert_array_equal(grid.counts(shares), whole)
        assert grid.max_count(shares) == whole.max()
        for a, b in [(0, 1), (2, 5), (grid.num_steps - 1, grid.num_steps)]:
            if 0 <= a <= b <= grid.num_steps:
                np.testing.assert_array_equal(grid.counts(shares, a, b), whole[a:b])


def test_a_plan_of_a_hundred_billion_samples_is_made_at_once_and_refuses_a_whole_epoch():
    tracemalloc.start()
    plan = ef.Plan(ef.Index(num_samples=10**11), ef.Topology(replicas=8), global_batch_size=256)
    one = plan.epoch(0, start=ef.Cursor(0, 390_000_000), stop=ef.Cursor(0, 390_000_001))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert plan.num_steps == 390_625_000 and one.ids.shape == (1, 8, 32) and peak < 2**20
    tracemalloc.start()
    with pytest.raises(ValueError, match="planning an epoch of 100,000,000,000 samples needs"):
        plan.epoch(0)
    assert tracemalloc.get_traced_memory()[1] < 2**20  # refused before anything of its size was built
    tracemalloc.stop()
