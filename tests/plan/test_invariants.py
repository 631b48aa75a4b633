"""Property tests for the invariants DESIGN.md promises (1-7), over random plans."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import evenflow as ef
from evenflow.plan import metrics

from .conftest import plan_cases, real_ids

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = [
    dict(),
    dict(balance="cost"),
    dict(bucket=True, balance="cost"),
    dict(bucket=True),
    dict(stratify=True),
]


def _plan(case, **mode):
    index, topo, kw = case
    if mode.get("stratify") and index.labels is None:
        index = ef.Index(index.num_samples, labels=np.arange(index.num_samples) % 3, costs=index.costs)
    if (mode.get("bucket") or mode.get("balance") == "cost") and index.costs is None:
        index = ef.Index(index.num_samples, labels=index.labels, costs=np.arange(index.num_samples) % 17 + 1)
    return ef.Plan(index, topo, **kw, **mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "count")
@SETTINGS
@given(case=plan_cases(), epoch=st.integers(0, 1000))
def test_exactly_once_and_equal_steps(case, epoch, mode):
    # Invariants 1 and 2.
    plan = _plan(case, **mode)
    ep = plan.epoch(epoch)
    n, g = plan.index.num_samples, plan.options.global_batch_size
    assert np.array_equal(np.sort(real_ids(ep)), np.arange(n))           # every id once
    assert ep.ids.shape == (-(-n // g), plan.topology.replicas, plan.slots)  # same steps for all
    sizes = ep.global_real_counts
    assert np.all(sizes[:-1] == g) and 1 <= sizes[-1] <= g
    assert np.all((ep.ids >= -1) & (ep.ids < n))


@SETTINGS
@given(case=plan_cases(), epoch=st.integers(0, 50))
def test_drop_remainder_drops_only_the_last_partial_step(case, epoch):
    index, topo, kw = case
    if index.num_samples < kw["global_batch_size"]:
        with pytest.raises(ValueError, match="drop_remainder"):
            ef.Plan(index, topo, drop_remainder=True, **kw)
        return
    ep = ef.Plan(index, topo, drop_remainder=True, **kw).epoch(epoch)
    ids = real_ids(ep)
    g = kw["global_batch_size"]
    assert ids.shape[0] == (index.num_samples // g) * g
    assert np.unique(ids).shape[0] == ids.shape[0]
    assert np.all(ep.global_real_counts == g)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "count")
@SETTINGS
@given(case=plan_cases(max_n=20_000), epoch=st.integers(0, 100))
def test_deterministic(case, epoch, mode):
    # Invariant 3 (within a process; tests/plan/test_plan.py checks across processes).
    a = _plan(case, **mode).epoch(epoch).ids
    b = _plan(case, **mode).epoch(epoch).ids
    assert np.array_equal(a, b)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "count")
@SETTINGS
@given(case=plan_cases(max_n=30_000), other_r=st.integers(1, 64), weighted=st.booleans(), epoch=st.integers(0, 9))
def test_world_size_invariant(case, other_r, weighted, epoch, mode):
    # Invariant 4: the set of ids in each global step does not depend on replicas or weights.
    plan = _plan(case, **mode)
    g = plan.options.global_batch_size
    other_r = min(other_r, g)
    w = tuple(np.linspace(1.0, 2.0, other_r)) if weighted else None
    other = plan.with_topology(ef.Topology(other_r, weights=w))
    a, b = plan.epoch(epoch), other.epoch(epoch)
    assert a.num_steps == b.num_steps
    for s in range(a.num_steps):
        assert np.array_equal(a.step_ids(s), b.step_ids(s))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "count")
@SETTINGS
@given(case=plan_cases(max_n=30_000), frac=st.floats(0, 1), other_r=st.integers(1, 64), epoch=st.integers(0, 9))
def test_resumable_and_elastic(case, frac, other_r, epoch, mode):
    # Invariant 5: same topology -> exactly the remaining slice; another topology -> the same remaining ids.
    plan = _plan(case, **mode)
    full = plan.epoch(epoch)
    s = int(round(frac * full.num_steps))
    rest = plan.epoch(epoch, start=ef.Cursor(epoch, s))
    assert rest.start_step == s
    assert np.array_equal(rest.ids, full.ids[s:])
    other_r = min(other_r, plan.options.global_batch_size)
    moved = plan.with_topology(ef.Topology(other_r)).epoch(epoch, start=ef.Cursor(epoch, s))
    assert moved.num_steps == full.num_steps - s
    assert np.array_equal(np.sort(real_ids(moved)), np.sort(real_ids(rest)))
    for i in range(moved.num_steps):
        assert np.array_equal(moved.step_ids(i), full.step_ids(s + i))


@SETTINGS
@given(case=plan_cases(weights=True), epoch=st.integers(0, 9))
def test_weighted_counts_follow_largest_remainder(case, epoch):
    # Invariant 6: per step, each replica's real count is within one of n * w_r / sum(w), sums to n,
    # and the extra samples go to the largest fractional quotas.
    plan = ef.Plan(case[0], case[1], **case[2])
    ep = plan.epoch(epoch)
    k = ep.real_counts
    n = ep.global_real_counts
    quota = n[:, None] * plan.topology.shares[None, :]
    assert np.all(np.abs(k - quota) < 1 + 1e-9)
    assert np.array_equal(k.sum(axis=1), n)
    frac = quota - np.floor(quota + 1e-9)
    got_extra = k > np.floor(quota + 1e-9)
    for s in range(k.shape[0]):
        if got_extra[s].any() and (~got_extra[s]).any():
            assert frac[s][got_extra[s]].min() >= frac[s][~got_extra[s]].max() - 1e-6


@SETTINGS
@given(case=plan_cases(weights=False), epoch=st.integers(0, 9))
def test_equal_weights_counts_differ_by_at_most_one(case, epoch):
    ep = ef.Plan(case[0], case[1], **case[2]).epoch(epoch)
    k = ep.real_counts
    assert np.all(k.max(axis=1) - k.min(axis=1) <= 1)
    totals = k.sum(axis=0)          # ties rotate, so the epoch totals are even too
    assert totals.max() - totals.min() <= 1


@SETTINGS
@given(case=plan_cases(labels=True, max_n=50_000), epoch=st.integers(0, 9))
def test_stratified(case, epoch):
    # Invariant 7: each step's label mix follows the dataset's (each step within two samples per
    # class), and every replica's count of each label is within one of its share n_c * k_r / n.
    index, topo, kw = case
    ep = ef.Plan(index, topo, stratify=True, **kw).epoch(epoch)
    codes = index.label_codes
    p = np.bincount(codes) / index.num_samples
    cum = np.zeros_like(p)
    seen = 0
    for s in range(ep.num_steps):
        ids = ep.step_ids(s)
        nc = np.bincount(codes[ids], minlength=p.shape[0])
        cum += nc
        seen += ids.shape[0]
        assert np.all(np.abs(nc - ids.shape[0] * p) < 2)
        # Running largest remainder keeps prefixes within one in nearly every case; with very
        # skewed classes and tiny steps it can exceed one slightly (docs/plan.md: worst measured 1.07).
        assert np.all(np.abs(cum - seen * p) < 1.5)
    per_step, _ = metrics.label_deviation(ep)
    assert per_step <= 1 + 1e-9


@SETTINGS
@given(case=plan_cases(labels=True, max_n=50_000, max_replicas=32), epoch=st.integers(0, 9))
def test_stratified_epoch_share(case, epoch):
    # Over the epoch every replica's count of each label is within one of its share N_c * K_r / N
    # too: per-step roundings are steered towards it and an epoch-level repair fixes what is left.
    index, topo, kw = case
    for drop in (False, True):
        if drop and index.num_samples < kw["global_batch_size"]:
            continue
        ep = ef.Plan(index, topo, stratify=True, drop_remainder=drop, **kw).epoch(epoch)
        per_step, epoch_dev = metrics.label_deviation(ep)
        assert per_step <= 1 + 1e-9
        assert epoch_dev <= 1 + 1e-9


# Cases where a repair that only tried 2x2 interchanges on sum(d^4) stopped above one (skewed
# classes, small steps). The repair now reaches one in each; the comment says what it takes.
EPOCH_REPAIR_CASES = [
    # Found by test_stratified_epoch_share in a CI run, stopped at 1.077: 2x2 interchanges once the
    # potential counts the excess over one first (d^4 alone rated the fix a loss).
    (dict(counts={0: 317, 1: 57, 3: 62, 6: 1464, 7: 28, 8: 8346, 9: 173}, replicas=26, g=30, seed=0), {}),
    # Stopped at 1.013: a 3-cycle of moves inside one step.
    (dict(counts={0: 979, 1: 8600, 2: 6, 3: 4, 4: 78, 5: 1, 6: 1446, 7: 3145, 8: 1403, 9: 71, 10: 12267},
          replicas=18, g=3699, seed=2954226764), dict(drop_remainder=True, epoch=3)),
    # Stopped at 1.037: a chain of two cycles in different steps.
    (dict(counts={0: 55, 1: 10, 2: 1, 4: 1, 5: 1, 7: 299, 8: 76, 10: 70}, replicas=27, g=31, seed=2754306153),
     dict(epoch=7)),
    # Stopped at 1.154, two cells off: a chain of two cycles.
    (dict(counts={0: 93, 1: 37, 2: 32, 3: 30, 8: 4711, 9: 12}, replicas=13, g=13, seed=1739711641),
     dict(drop_remainder=True)),
    # Stopped at 1.045: a chain of two cycles whose first is not among the cheapest (each step offers
    # the same few cheap cycles, so the search keeps one per change of the epoch totals).
    (dict(counts={0: 54, 1: 9, 2: 261, 3: 11760, 6: 1}, replicas=20, g=36, seed=3292781844), {}),
    # Stopped at 1.028: a 3-cycle inside one step.
    (dict(counts={0: 223, 1: 966, 2: 4893, 3: 7333, 4: 36, 5: 444, 6: 285, 7: 102, 8: 90, 9: 22, 10: 200},
          replicas=32, g=51, seed=2900366284), dict(drop_remainder=True)),
]


@pytest.mark.parametrize("case, extra", EPOCH_REPAIR_CASES)
def test_the_epoch_repair_reaches_one_where_2x2_interchanges_stopped_short(case, extra):
    counts = case["counts"]
    labels = np.random.default_rng(0).permutation(np.repeat(list(counts), list(counts.values())))
    plan = ef.Plan(ef.Index(len(labels), labels=labels), ef.Topology(case["replicas"]),
                   global_batch_size=case["g"], seed=case["seed"], stratify=True,
                   drop_remainder=extra.get("drop_remainder", False))
    ep = plan.epoch(extra.get("epoch", 0))
    per_step, epoch_dev = metrics.label_deviation(ep)
    assert per_step <= 1 + 1e-9
    assert epoch_dev <= 1 + 1e-9
    # The repair only moves ids between replicas inside a step: each step's id set is the one of
    # a single replica, and every id appears once.
    flat = ef.Plan(plan.index, ef.Topology(1), global_batch_size=case["g"], seed=case["seed"], stratify=True,
                   drop_remainder=extra.get("drop_remainder", False)).epoch(extra.get("epoch", 0))
    for s in range(ep.num_steps):
        assert np.array_equal(ep.step_ids(s), flat.step_ids(s))
