"""Tests of the cost split itself (src/evenflow/plan/assign_cost.py): chunking, lower bound, runs."""
import numpy as np
import pytest

from evenflow.plan import assign_cost as ac


def _layout(n_steps, g, r, costs, weights=None, runs=False, seed=0):
    order = np.random.default_rng(seed).permutation(costs.shape[0])[: n_steps * g].astype(np.int64)
    bounds = np.arange(n_steps + 1, dtype=np.int64) * g
    counts = np.full((n_steps, r), g // r, dtype=np.int64)
    slots = ac.cost_slots(g // r, g)
    w = np.ones(r) / r if weights is None else np.asarray(weights, float) / np.sum(weights)
    ids = ac.assign_cost(order, bounds, counts, slots, costs, w, runs=runs)
    return order, ids, w


def _loads(ids, costs):
    return np.where(ids >= 0, costs[np.maximum(ids, 0)], 0.0).sum(axis=2)


@pytest.mark.parametrize("runs", [False, True])
def test_chunked_planning_matches_one_chunk(monkeypatch, runs):
    # Chunking bounds memory; it must not change which samples a step holds or the balance.
    costs = np.random.default_rng(1).lognormal(0, 1, 64 * 40)
    _, whole, _ = _layout(40, 64, 4, costs, runs=runs)
    monkeypatch.setattr(ac, "_CHUNK_SAMPLES", 64 * 3)  # 3 steps per chunk, a partial last chunk
    order, chunked, _ = _layout(40, 64, 4, costs, runs=runs)
    assert np.array_equal(whole, chunked)
    for s in range(40):
        assert sorted(chunked[s][chunked[s] >= 0]) == sorted(order[s * 64:(s + 1) * 64])


@pytest.mark.parametrize("cores", [1, 2, 3])
def test_chunks_planned_on_several_cores_match_one_core(monkeypatch, cores):
    # Chunks run in threads, one per core; the result must not depend on how many or their timing.
    costs = np.random.default_rng(4).lognormal(0, 1, 64 * 40)
    monkeypatch.setattr(ac, "_cores", lambda: 1)
    _, serial, _ = _layout(40, 64, 4, costs, runs=True)
    monkeypatch.setattr(ac, "_cores", lambda: cores)
    monkeypatch.setattr(ac, "_PARALLEL_MIN", 64)  # small chunks here, so several threads start
    monkeypatch.setattr(ac, "_CHUNK_SAMPLES", 64 * 7)
    _, threaded, _ = _layout(40, 64, 4, costs, runs=True)
    assert np.array_equal(serial, threaded)


def test_one_giant_sample_takes_only_what_the_others_cannot_hold():
    # The lower bound is the giant sample itself: its replica takes no other sample, except those
    # the other replicas have no free slot for (slots cap counts at a quarter over count mode's).
    costs = np.ones(64)
    costs[5] = 1000.0
    _, ids, _ = _layout(1, 64, 4, costs)
    slots = ids.shape[2]
    rep = int(np.argwhere(ids[0] == 5)[0][0])
    assert (ids[0, rep] >= 0).sum() == 1 + max(0, 63 - 3 * slots)
    assert _loads(ids, costs)[0, rep] == 1000 + max(0, 63 - 3 * slots)


def test_weighted_loads_follow_weights():
    costs = np.random.default_rng(2).lognormal(0, 0.5, 256 * 20)
    _, ids, w = _layout(20, 256, 4, costs, weights=(2, 1, 1, 1))
    per_weight = _loads(ids, costs) / w[None, :]
    assert (per_weight.max(axis=1) / per_weight.mean(axis=1)).max() < 1.02


def test_runs_pad_less_and_balance_within_one_percent_of_greedy():
    rng = np.random.default_rng(3)
    # Bucketed-like steps: each step's costs come from a narrow band, as after bucketing.
    n_steps, g, r = 30, 256, 8
    costs = np.concatenate([np.round(rng.uniform(b, b * 1.3, g)) for b in np.geomspace(10, 2000, n_steps)])
    order = np.arange(n_steps * g, dtype=np.int64)
    bounds = np.arange(n_steps + 1, dtype=np.int64) * g
    counts = np.full((n_steps, r), g // r, dtype=np.int64)
    slots = ac.cost_slots(g // r, g)
    w = np.ones(r) / r
    greedy = ac.assign_cost(order, bounds, counts, slots, costs, w, runs=False)
    runs = ac.assign_cost(order, bounds, counts, slots, costs, w, runs=True)

    def padded(ids):
        c = np.where(ids >= 0, costs[np.maximum(ids, 0)], 0.0)
        return (c.max(axis=2) * (ids >= 0).sum(axis=2)).sum()

    assert padded(runs) < padded(greedy)
    lg, lr = _loads(greedy, costs).max(axis=1), _loads(runs, costs).max(axis=1)
    assert np.all(lr <= lg * (1 + ac._RUNS_SLACK) + 1e-9)
    for s in range(n_steps):
        assert sorted(runs[s][runs[s] >= 0]) == list(range(s * g, (s + 1) * g))
