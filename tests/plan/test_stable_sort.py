"""The fast stable argsort of costs (src/evenflow/plan/stable_sort.py) is numpy's stable argsort."""
import numpy as np
import pytest

from evenflow.plan.assign import cost as ac
from evenflow.plan.assign.cost_refine import refine
from evenflow.plan.assign.runs import runs_split
from evenflow.plan.stable_sort import stable_argsort_nonnegative


def _inputs():
    rng = np.random.default_rng(7)
    n = 50_000  # above the size where numpy's own sort is used
    yield "lognormal", rng.lognormal(0, 1, n)
    yield "integer lengths", rng.integers(1, 300, n).astype(np.float64)
    # Costs equal but for their last bits: every run of equal truncated keys needs the exact re-sort.
    yield "last bits", 1.0 + rng.integers(0, 4, n) * 2.0**-50
    pairs = rng.lognormal(0, 1, n)
    pairs[rng.integers(0, n, 200)] = np.nextafter(pairs[rng.integers(0, n, 200)], np.inf)  # a few near-twins
    yield "a few near twins", pairs
    yield "zeros of both signs", np.where(rng.random(n) < 0.5, -0.0, 0.0) * (rng.random(n) < 0.7) + \
        (rng.random(n) < 0.3) * rng.random(n)
    yield "huge and tiny", np.concatenate([rng.lognormal(0, 1, n) * 1e300, rng.random(n) * 1e-310])
    yield "float32", rng.lognormal(0, 1, n).astype(np.float32)
    yield "small", rng.lognormal(0, 1, 100)
    yield "one", np.array([2.0])
    yield "empty", np.zeros(0)


@pytest.mark.parametrize("name,values", list(_inputs()), ids=[name for name, _ in _inputs()])
def test_equals_numpys_stable_argsort(name, values):
    got = stable_argsort_nonnegative(values)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argsort(values, kind="stable"))


def test_a_memory_mapped_cost_column_sorts_the_same(tmp_path):
    values = np.random.default_rng(3).lognormal(0, 2, 20_000)
    np.save(tmp_path / "c.npy", values)
    mapped = np.load(tmp_path / "c.npy", mmap_mode="r")
    assert np.array_equal(stable_argsort_nonnegative(mapped[5:19_000]), np.argsort(values[5:19_000], kind="stable"))


def _costs(kind: str, n: int, g: int, rng) -> np.ndarray:
    if kind == "two_level":  # a share of costly samples that varies by step, the rest 20x cheaper
        costly = rng.random(n) < rng.uniform(0.2, 0.8, n // g).repeat(g)
        return np.where(costly, 1.0, 0.05) * rng.uniform(1.0, 1.2, n)
    return {"lognormal": rng.lognormal(0, 1.5, n), "integers": rng.integers(1, 9, n).astype(float),
            "equal": np.ones(n)}[kind]


@pytest.mark.parametrize("costs,r,g,iterations,kinds", [
    ("lognormal", 8, 96, 32, ""), ("integers", 8, 96, 32, ""), ("equal", 8, 96, 32, ""),
    ("two_level", 8, 24, 2, "near,chance,hopeless"), ("two_level", 8, 400, 32, "near,hopeless")])
def test_runs_split_skips_the_greedy_only_where_it_could_not_win(costs, r, g, iterations, kinds):
    # _split_steps plans the greedy split only for steps whose runs are not within the slack of the
    # lower bound, and refines runs that cannot end within it only where the greedy split leaves them
    # a chance. The result must be that of refining both splits everywhere and picking per step.
    rng = np.random.default_rng(11)
    steps = 60
    c = _costs(costs, g * steps, g, rng)
    w = rng.uniform(0.5, 1.0, r)
    slots = ac.cost_slots(g // r, g)
    sid = rng.permutation(g * steps).reshape(steps, g)
    count = np.full(steps, g)
    count[-1] = g - 5  # a short last step, padded
    sid[-1, count[-1]:] = -1
    got = ac._split_steps(sid.copy(), count, slots, c, w, iterations, runs=True)

    cs = c[sid]
    cs.ravel()[steps * g - 5:] = 0.0
    sid_s, cs = ac._sort_desc(sid.copy(), cs)
    floor = np.maximum(cs.sum(axis=1) / w.sum(), cs.max(axis=1) / w.max())
    greedy, g_loads = ac._greedy_split(sid_s, cs, w, slots, count, floor, iterations, steps * g - 5, 1)
    g_max = (g_loads / w).max(axis=1)
    runs, r_cost3, r_loads, r_fill = runs_split(sid_s, cs, w, slots)
    # The bound the shortcut relies on: a pass takes at most a replica's largest own sample off it.
    reach = ((r_loads - iterations * r_cost3.max(axis=2)) / w).max(axis=1)
    refine(runs, r_cost3, r_loads, r_fill, w, floor, iterations, count)
    assert np.all((r_loads / w).max(axis=1) >= reach * (1 - 1e-9))
    keep = (r_loads / w).max(axis=1) <= g_max * (1 + ac._RUNS_SLACK)
    assert np.array_equal(got, np.where(keep[:, None, None], runs, greedy))
    near = reach <= floor * (1 + ac._RUNS_SLACK)
    hopeless = ~near & (reach > g_max * (1 + ac._RUNS_SLACK))
    found = {"near": near.any(), "chance": (~near & ~hopeless).any(), "hopeless": hopeless.any()}
    assert all(found[k] for k in kinds.split(",") if k), found  # the cases meant to cover each branch do


@pytest.mark.parametrize("g", [1, 2, 7, 64, 1 << 12])
def test_argsort_of_distinct_keys_by_packed_sort_equals_numpys(g):
    # The in-step shuffle of bucketed steps sorts mix64 keys (a bijection: distinct in a row).
    # Rows where keys share their top bits (forced here in every other row) fall back to argsort.
    from evenflow.plan.assign.bucket import argsort_distinct_rows
    from evenflow.plan.shuffle import mix64

    rows = 6
    keys = mix64(np.arange(rows * g, dtype=np.uint64), np.uint64(99)).reshape(rows, g)
    if g > 1:
        b = max(1, (g - 1).bit_length())
        keys[::2, 1] = (keys[::2, 0] >> np.uint64(b) << np.uint64(b)) | (~keys[::2, 0] & np.uint64((1 << b) - 1))
        assert np.all(keys[::2, 1] != keys[::2, 0])  # still distinct, same top bits
    assert np.array_equal(argsort_distinct_rows(keys.copy()), np.argsort(keys, axis=1))
