"""Table tests for edge cases, bad input and cross-process determinism of Plan."""
import re
import subprocess
import sys

import numpy as np
import pytest

import evenflow as ef
from evenflow.plan import metrics

from .conftest import real_ids


@pytest.mark.parametrize("n,r,g,weights,expect_steps,expect_slots", [
    (10, 4, 32, None, 1, 3),            # N < G: one partial step, slots from the real split
    (3, 8, 8, None, 1, 1),              # N < replicas: some replicas are all padding
    (1, 1, 1, None, 1, 1),              # the smallest plan
    (1000, 1, 100, None, 10, 100),      # one replica takes everything
    (1000, 4, 100, (1, 1, 1, 0.02), 10, 33),  # a weight far smaller than the others: still >= 1 per step
    (257, 8, 256, None, 2, 32),         # one sample in the last step
])
def test_edge_cases(n, r, g, weights, expect_steps, expect_slots):
    plan = ef.Plan(ef.Index(n), ef.Topology(r, weights=weights), global_batch_size=g)
    ep = plan.epoch(0)
    assert (ep.num_steps, ep.slots) == (expect_steps, expect_slots)
    assert np.array_equal(np.sort(real_ids(ep)), np.arange(n))
    full = ep.global_real_counts == g
    if full.any():
        assert ep.real_counts[full].min() >= 1


def test_all_costs_equal_cost_mode_matches_count_balance():
    index = ef.Index(1000, costs=np.full(1000, 7.0))
    ep = ef.Plan(index, ef.Topology(8), global_batch_size=64, balance="cost").epoch(0)
    assert np.all(metrics.step_imbalance(ep) == 1.0)
    assert np.array_equal(np.sort(real_ids(ep)), np.arange(1000))


def test_cost_mode_beats_count_mode_on_lognormal_lengths():
    rng = np.random.default_rng(0)
    index = ef.Index(20_000, costs=rng.lognormal(3, 1, 20_000))
    count = ef.Plan(index, ef.Topology(8), global_batch_size=256).epoch(0)
    cost = ef.Plan(index, ef.Topology(8), global_batch_size=256, balance="cost").epoch(0)
    imb_count, imb_cost = metrics.step_imbalance(count)[:-1], metrics.step_imbalance(cost)[:-1]
    assert imb_cost.mean() < imb_count.mean()
    assert np.percentile(imb_cost, 50) < 1.01          # median step is nearly perfect


def test_weighted_cost_mode_scales_load_by_weight():
    rng = np.random.default_rng(1)
    index = ef.Index(20_000, costs=rng.lognormal(3, 0.5, 20_000))
    ep = ef.Plan(index, ef.Topology(4, weights=(1, 1, 1, 0.5)), global_batch_size=256, balance="cost").epoch(0)
    loads = metrics.replica_loads(ep)[:-1].sum(axis=0)
    assert loads[3] / loads[:3].mean() == pytest.approx(0.5, rel=0.02)


def test_bucketing_raises_token_efficiency():
    rng = np.random.default_rng(2)
    index = ef.Index(50_000, costs=rng.lognormal(3, 1, 50_000))
    plain = ef.Plan(index, ef.Topology(8), global_batch_size=256, balance="cost").epoch(0)
    bucketed = ef.Plan(index, ef.Topology(8), global_batch_size=256, balance="cost", bucket=True).epoch(0)
    assert metrics.token_efficiency(bucketed) > 2 * metrics.token_efficiency(plain)


def test_bucketing_keeps_step_order_random_across_epochs():
    rng = np.random.default_rng(3)
    index = ef.Index(5000, costs=rng.integers(1, 50, 5000))
    plan = ef.Plan(index, ef.Topology(4), global_batch_size=64, bucket=True)
    a, b = plan.epoch(0), plan.epoch(1)
    assert not np.array_equal(a.step_ids(0), b.step_ids(0))
    first_costs = [index.costs[a.step_ids(s)].mean() for s in range(a.num_steps - 1)]
    assert not np.all(np.diff(first_costs) >= 0)        # steps are not in cost order


def test_epochs_differ_and_seeds_differ():
    plan = ef.Plan(ef.Index(1000), ef.Topology(4), global_batch_size=100, seed=5)
    assert not np.array_equal(plan.epoch(0).ids, plan.epoch(1).ids)
    other = ef.Plan(ef.Index(1000), ef.Topology(4), global_batch_size=100, seed=6)
    assert not np.array_equal(plan.epoch(0).ids, other.epoch(0).ids)


def test_same_plan_in_another_process():
    # Invariant 3 across processes: a fresh interpreter computes the same array.
    code = ("import numpy as np, evenflow as ef, hashlib;"
            "i=ef.Index(5000, labels=np.arange(5000)%7, costs=np.arange(5000)%13+1.0);"
            "e=ef.Plan(i, ef.Topology(3, weights=(1,2,3)), global_batch_size=96, seed=11, stratify=True).epoch(4);"
            "print(hashlib.sha256(e.ids.tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    import hashlib
    i = ef.Index(5000, labels=np.arange(5000) % 7, costs=np.arange(5000) % 13 + 1.0)
    e = ef.Plan(i, ef.Topology(3, weights=(1, 2, 3)), global_batch_size=96, seed=11, stratify=True).epoch(4)
    assert out.stdout.strip() == hashlib.sha256(e.ids.tobytes()).hexdigest()


def test_cursor_at_end_gives_empty_plan():
    plan = ef.Plan(ef.Index(100), ef.Topology(2), global_batch_size=10)
    ep = plan.epoch(0, start=ef.Cursor(0, 10))
    assert ep.num_steps == 0 and ep.ids.shape == (0, 2, 5)


def test_fingerprint_changes_with_seed_and_options():
    idx = ef.Index(100)
    a = ef.Plan(idx, ef.Topology(2), global_batch_size=10, seed=1)
    assert a.fingerprint() == ef.Plan(idx, ef.Topology(4), global_batch_size=10, seed=1).fingerprint()
    assert a.fingerprint() != ef.Plan(idx, ef.Topology(2), global_batch_size=10, seed=2).fingerprint()
    assert a.fingerprint() != ef.Plan(ef.Index(101), ef.Topology(2), global_batch_size=10, seed=1).fingerprint()


def test_the_fingerprint_names_the_planners_version(monkeypatch):
    # Checkpoints of a planner that routes samples differently must not resume into this one.
    from evenflow.plan import plan as plan_mod

    a = ef.Plan(ef.Index(100), ef.Topology(2), global_batch_size=10, seed=1).fingerprint()
    monkeypatch.setattr(plan_mod, "PLANNER_VERSION", plan_mod.PLANNER_VERSION + 1)
    assert a.endswith(f"-v{plan_mod.PLANNER_VERSION - 1}")
    assert ef.Plan(ef.Index(100), ef.Topology(2), global_batch_size=10, seed=1).fingerprint() != a


def test_the_index_fingerprint_hashes_its_columns_a_chunk_at_a_time_and_keeps_its_digest(tmp_path):
    import hashlib
    import tracemalloc

    # Run directories store fingerprints: the digest stays sha256(N, labels' bytes, costs' bytes).
    rng = np.random.default_rng(0)
    n = (3 << 20) + 5  # chunks of 2^20 entries and a short last one
    labels, costs = rng.integers(0, 9, n), rng.random(n)
    np.save(tmp_path / "costs.npy", costs)
    for index in (ef.Index(n, labels=labels, costs=costs), ef.Index(n, costs=np.load(tmp_path / "costs.npy",
                                                                                       mmap_mode="r")),
                  ef.Index(n, labels=labels.astype(np.float64)), ef.Index(n)):
        h = hashlib.sha256(str(n).encode())
        for arr in (index.labels, index.costs):
            h.update(b"|" if arr is None else np.ascontiguousarray(arr).tobytes())
        tracemalloc.start()
        got = index.fingerprint()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got == h.hexdigest()[:16] and index.fingerprint() == got
        assert peak < 2**20, peak  # no copy of a 25 MiB column


@pytest.mark.parametrize("make", [
    lambda rng, n: rng.integers(0, 10, n),                    # class ids: counted a chunk at a time
    lambda rng, n: rng.integers(-7, 3, n).astype(np.float64),  # whole floats, negative ones
    lambda rng, n: rng.integers(-2**40, 2**40, n),           # a wide range: each chunk sorted
    lambda rng, n: np.full(n, 42),
])
def test_index_classes_and_codes_are_numpys_unique_without_sorting_every_label(make, monkeypatch):
    import tracemalloc

    from evenflow.plan import index as index_mod

    rng = np.random.default_rng(1)
    n = (1 << 20) + 11  # two chunks
    labels = make(rng, n)
    classes, codes = np.unique(labels, return_inverse=True)
    ids = rng.integers(0, n, (3, 4, 5))
    tracemalloc.start()
    index = ef.Index(n, labels=labels)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if classes.size < 100:  # a float input's int64 copy and a chunk's scratch, not sorted copies of all
        assert peak < n * 8 + 2**24, peak
    np.testing.assert_array_equal(index.classes, classes)
    np.testing.assert_array_equal(index.codes_of(ids), codes[ids])  # before every code exists
    np.testing.assert_array_equal(index.label_codes, codes)
    np.testing.assert_array_equal(index.codes_of(ids), codes[ids])
    assert index.num_classes == classes.size and index.label_codes.dtype == np.int64
    monkeypatch.setattr(index_mod, "_DISTINCT_MAX", 4)  # nearly all distinct: one sort of all, the same classes
    np.testing.assert_array_equal(ef.Index(n, labels=labels).classes, classes)


@pytest.mark.parametrize("build,error,match", [
    (lambda: ef.Index(0), ValueError, r"at least 1, got 0"),
    (lambda: ef.Index(2.5), TypeError, r"must be an int"),
    (lambda: ef.Topology(0), ValueError, r"replicas must be at least 1, got 0"),
    (lambda: ef.Topology(3, weights=(1, 1)), ValueError, r"replicas is 3 but 2 weights"),
    (lambda: ef.Topology(2, weights=(1, -1)), ValueError, r"weight 1 is -1"),
    (lambda: ef.Topology(2, weights=(1, 0)), ValueError, r"weight 1 is 0"),
    (lambda: ef.Index(3, labels=[1, 2]), ValueError, r"num_samples is 3 but labels has 2"),
    (lambda: ef.Index(3, costs=[1.0, float("nan"), 2.0]), ValueError, r"costs\[1\] is nan"),
    (lambda: ef.Index(3, costs=[1.0, -1.0, 2.0]), ValueError, r"costs\[1\] is -1"),
    (lambda: ef.Index(2, labels=[0.5, 1.0]), ValueError, r"whole numbers"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(8), global_batch_size=4), ValueError,
     r"global_batch_size is 4 and replicas is 8; use a global batch size of at least 8"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4, balance="tokens"), ValueError,
     r"balance must be one of cost, count, got 'tokens'"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4, stratify=True), ValueError,
     r"needs labels"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4, bucket=True), ValueError, r"needs costs"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4).epoch(0, start=ef.Cursor(0, 4)),
     ValueError, r"within the epoch's 3 steps, got step 4"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4).epoch(1, start=ef.Cursor(0, 1)),
     ValueError, r"cursor is in epoch 0 but epoch 1"),
    (lambda: ef.Cursor(0, -1), ValueError, r"Cursor.step must be at least 0, got -1"),
    (lambda: ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4, seed=-1), ValueError, r"seed"),
])
def test_bad_input_messages(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize("option, value, needs", [
    ("bucket_window", 8, "bucket=True"), ("pack_overflow", "split", "pack=L"), ("pack_attention", 0.5, "pack=L"),
])
def test_an_option_of_bucketed_or_packed_plans_is_refused_on_a_plan_that_is_neither(option, value, needs):
    index = ef.Index(100, costs=np.arange(1.0, 101.0))
    with pytest.raises(ValueError, match=rf"^{option}={value!r} shapes only plans with {re.escape(needs)}, "
                                         rf"and this one has none; pass {re.escape(needs)} or leave {option} out$"):
        ef.Plan(index, ef.Topology(2), global_batch_size=10, balance="cost", **{option: value})
    # Its default is accepted either way (it changes nothing), and the option itself where it applies.
    default = ef.PlanOptions.__dataclass_fields__[option].default
    ef.Plan(index, ef.Topology(2), global_batch_size=10, balance="cost", **{option: default})
    where = {"bucket": True} if needs == "bucket=True" else {"pack": 120}
    ef.Plan(index, ef.Topology(2), global_batch_size=10, balance="cost", **where, **{option: value}).epoch(0)


def test_cost_mode_without_costs_warns():
    with pytest.warns(UserWarning, match="same as balance='count'"):
        ef.Plan(ef.Index(10), ef.Topology(2), global_batch_size=4, balance="cost")


def test_public_surface_is_sorted_and_light():
    assert ef.__all__ == sorted(ef.__all__)
    code = ("import sys, evenflow; "
            "print(any(m in sys.modules for m in ('tensorflow', 'torch', 'keras', 'evenflow.records')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_testing_helpers_pass_and_fail():
    from evenflow import testing
    plan = ef.Plan(ef.Index(1000, labels=np.arange(1000) % 5), ef.Topology(4), global_batch_size=64, stratify=True)
    testing.assert_exactly_once(plan, 3)
    testing.assert_resumes_identically(plan, 3, 7)
    testing.assert_resumes_identically(plan, 3, 7, topology=ef.Topology(6, weights=(1, 1, 1, 1, 2, 2)))

    class Broken(ef.Plan):     # a planner that repeats a sample must be caught
        def epoch(self, epoch, start=None):
            ep = super().epoch(epoch, start)
            ep.ids[0, 0, 0] = ep.ids[0, 0, 1]
            return ep
    broken = Broken(ef.Index(100), ef.Topology(2), global_batch_size=10)
    with pytest.raises(AssertionError, match="not exactly-once"):
        testing.assert_exactly_once(broken, 0)


def test_stratified_step_counts_terminate_when_rounding_overshoots():
    # Regression: one sample per step and very skewed classes once made the floor() guard give a
    # step more samples than it has, which later left a step with no class to fill it (a hang).
    from evenflow.plan.order import _class_counts_per_step
    totals = np.array([8026, 3, 0, 23, 0, 1611, 0, 28885, 7, 1852, 5348])
    sizes = np.ones(int(totals.sum()), dtype=np.int64)
    out = _class_counts_per_step(sizes, totals)
    assert np.array_equal(out.sum(axis=1), sizes)
    assert np.array_equal(out.sum(axis=0), totals)


@pytest.mark.parametrize("balance", ["count", "cost"])
def test_a_replica_whose_share_rounds_to_zero_gets_padding_rows_in_equal_steps(balance):
    # Weight 0.001 of 2.001 is 0.008 samples of a 16-sample step: the replica gets no real sample
    # in most (count mode: all) steps, yet runs every step on all-padding rows, and nothing is lost.
    rng = np.random.default_rng(0)
    index = ef.Index(100, costs=rng.lognormal(3, 1, 100).round() + 1)
    plan = ef.Plan(index, ef.Topology(3, weights=(1, 1, 0.001)), global_batch_size=16, balance=balance)
    ep = plan.epoch(0)
    assert ep.ids.shape[:2] == (plan.num_steps, 3)
    assert sorted(ep.ids[ep.ids >= 0].tolist()) == list(range(100))
    starved = (ep.ids[:, 2, :] >= 0).sum(axis=1)
    assert (starved == 0).sum() >= plan.num_steps - 1
    assert (ep.global_real_counts == (ep.ids >= 0).sum(axis=(1, 2))).all()


def test_costs_whose_sum_would_overflow_are_refused_naming_the_sample():
    costs = np.ones(1000)
    costs[5] = 1e308
    with pytest.raises(ValueError, match=r"Index costs must be at most 1.8e\+305 \(so 1000 of them sum to a number\), "
                                         r"but costs\[5\] is 1e\+308"):
        ef.Index(1000, costs=costs)
    with pytest.raises(ValueError, match=r"Index costs must be >= 0, but costs\[1\] is -1.0"):
        ef.Index(3, costs=[1.0, -1.0, 2.0])
