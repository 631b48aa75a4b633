"""Tests of the cost split itself (src/evenflow/plan/assign/cost.py): chunking, lower bound, runs."""
import numpy as np
import pytest

from evenflow.plan.assign import cost as ac
from evenflow.plan.assign.cost_refine import refine


def _layout(n_steps, g, r, costs, weights=None, runs=False, seed=0):
    order = np.random.default_rng(seed).permutation(costs.shape[0])[: n_steps * g].astype(np.int64)
    bounds = np.arange(n_steps + 1, dtype=np.int64) * g
    slots = ac.cost_slots(g // r, g)
    w = np.ones(r) / r if weights is None else np.asarray(weights, float) / np.sum(weights)
    ids = ac.assign_cost(order, bounds, slots, costs, w, runs=runs)
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
    monkeypatch.setattr(ac, "cores", lambda: 1)
    _, serial, _ = _layout(40, 64, 4, costs, runs=True)
    monkeypatch.setattr(ac, "cores", lambda: cores)
    monkeypatch.setattr(ac, "_PARALLEL_MIN", 64)  # small chunks here, so several threads start
    monkeypatch.setattr(ac, "_CHUNK_SAMPLES", 64 * 7)
    _, threaded, _ = _layout(40, 64, 4, costs, runs=True)
    assert np.array_equal(serial, threaded)


@pytest.mark.parametrize("per_replica", [6, 40])  # 8 and 50 slots: exchanges rated all-pairs, and by sort
@pytest.mark.parametrize("weighted", [False, True])
def test_one_chunks_refinement_on_several_threads_matches_one_thread(monkeypatch, per_replica, weighted):
    # With one chunk the refinement rates each pass's pairs in blocks on every core; the blocks
    # and the threads must not change a single exchange.
    from evenflow.plan.assign import cost_refine as rf

    rng = np.random.default_rng(8)
    r, steps = 64, 12
    g = r * per_replica
    costs = rng.lognormal(0, 1, g * steps)
    order, bounds = rng.permutation(g * steps), np.arange(steps + 1) * g
    w = rng.uniform(0.5, 1.5, r) if weighted else np.ones(r)
    slots = ac.cost_slots(per_replica, g)
    monkeypatch.setattr(ac, "cores", lambda: 1)
    serial = ac.assign_cost(order, bounds, slots, costs, w, runs=True)
    calls = []
    monkeypatch.setattr(rf, "refine", lambda *a, **k: calls.append(a[-1]) or refine(*a, **k))
    monkeypatch.setattr(ac, "refine", rf.refine)
    monkeypatch.setattr(ac, "cores", lambda: 3)
    monkeypatch.setattr(rf, "_THREAD_MIN", 0)
    monkeypatch.setattr(rf, "_BLOCK_BYTES", 8 * 8 * 8 * 5)  # 5 pairs per block: several blocks per thread
    monkeypatch.setattr(rf, "_SORT_BLOCK_BYTES", 16 * 50 * 5)
    threaded = ac.assign_cost(order, bounds, slots, costs, w, runs=True)
    assert calls and set(calls) == {3}  # one chunk (too few samples to split), refined on 3 threads
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
    slots = ac.cost_slots(g // r, g)
    w = np.ones(r) / r
    greedy = ac.assign_cost(order, bounds, slots, costs, w, runs=False)
    runs = ac.assign_cost(order, bounds, slots, costs, w, runs=True)

    def padded(ids):
        c = np.where(ids >= 0, costs[np.maximum(ids, 0)], 0.0)
        return (c.max(axis=2) * (ids >= 0).sum(axis=2)).sum()

    assert padded(runs) < padded(greedy)
    lg, lr = _loads(greedy, costs).max(axis=1), _loads(runs, costs).max(axis=1)
    assert np.all(lr <= lg * (1 + ac._RUNS_SLACK) + 1e-9)
    for s in range(n_steps):
        assert sorted(runs[s][runs[s] >= 0]) == list(range(s * g, (s + 1) * g))


@pytest.mark.parametrize("g, r", [(64, 8), (48, 4), (1024, 8)])
@pytest.mark.parametrize("weights", [None, "skewed"])
def test_a_short_last_step_is_planned_as_it_would_be_alone(g, r, weights):
    # The short last step is padded into the chunk of full steps (one pipeline instead of two);
    # its padding must neither take a slot nor change any step's split. (Steps of 512 samples or
    # more sort by a rounded key, so a padded short step is compared with the full steps only.)
    rng = np.random.default_rng(5)
    costs = rng.lognormal(0, 1, 10 * g)
    w = np.ones(r) / r if weights is None else rng.uniform(0.5, 2.0, r)
    slots = ac.cost_slots(g // r, g)
    order = rng.permutation(costs.shape[0]).astype(np.int64)
    n = 6 * g + g // 3
    bounds = np.append(np.arange(7) * g, n)
    together = ac.assign_cost(order[:n], bounds, slots, costs, w)
    full = ac.assign_cost(order[:6 * g], bounds[:-1], slots, costs, w)
    last = ac.assign_cost(order[6 * g:n], np.array([0, n - 6 * g]), slots, costs, w)
    assert np.array_equal(together[:6], full)
    assert np.array_equal(together[6:], last) or g >= ac._RADIX_FROM
    assert sorted(together[6][together[6] >= 0]) == sorted(order[6 * g:n])
    assert np.all((together[6] >= 0).sum(axis=1) <= slots)


@pytest.mark.parametrize("m", [3, 10, 40])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_exchange_search_finds_the_best_exchange_of_every_pair(m, weighted):
    # Exhaustive check of the vectorised search (all m x m pairs for a few slots, a sort above):
    # no exchange or move into a free slot gives a pair a lower maximum than the one chosen.
    from evenflow.plan.assign import cost_refine as rf

    rng = np.random.default_rng(6)
    p = 200
    fa, fb = rng.integers(1, m + 1, p), rng.integers(0, m + 1, p)
    a = np.where(np.arange(m) < fa[:, None], rng.lognormal(0, 1, (p, m)), 0.0)
    b = np.where(np.arange(m) < fb[:, None], rng.lognormal(0, 1, (p, m)), 0.0)
    wa = rng.uniform(0.5, 2.0, p) if weighted else np.ones(p)
    wb = rng.uniform(0.5, 2.0, p) if weighted else np.ones(p)
    la, lb = a.sum(axis=1), b.sum(axis=1)
    heavy = la / wa >= lb / wb
    a, b, la, lb, wa, wb = a[heavy], b[heavy], la[heavy], lb[heavy], wa[heavy], wb[heavy]
    k = len(a)
    val, ia, jb = rf._best_exchange(np.concatenate((a, b)), np.arange(k), k + np.arange(k), la, lb, wa, wb,
                                    equal=not weighted)
    d = a[:, :, None] - b[:, None, :]                       # every exchange (a free b slot: a move)
    every = np.maximum((la[:, None, None] - d) / wa[:, None, None], (lb[:, None, None] + d) / wb[:, None, None])
    best = every.reshape(len(a), -1).min(axis=1)
    np.testing.assert_allclose(val, best, rtol=1e-12)
    np.testing.assert_allclose(val, every[np.arange(len(a)), ia, jb], rtol=1e-12)


def test_cost_plans_stay_those_of_their_planner_version():
    # Run directories resume only plans of the same PLANNER_VERSION, so a change to the cost split
    # that routes any sample differently must raise it. Costs are multiples of 1/8 (integers too), so
    # every load is summed exactly and the digest does not depend on the order of additions.
    import hashlib

    import evenflow as ef
    from evenflow.plan import PLANNER_VERSION

    h = hashlib.sha256()
    rng = np.random.default_rng(5)
    n = 6000
    for costs in (rng.integers(1, 50, n).astype(float), rng.integers(1, 400, n) / 8.0):
        # count slots 8 and 2 (all exchanges rated), 160 (rated by sort, steps sorted by radix), weights, runs
        for r, per, weights, bucket in ((8, 8, None, False), (8, 2, None, False), (3, 5, (1, 2, 3), False),
                                        (4, 160, None, False), (8, 8, None, True), (5, 24, (1, 1, 2, 2, 3), True)):
            plan = ef.Plan(ef.Index(n, costs=costs), ef.Topology(r, weights=weights), global_batch_size=r * per,
                           seed=3, balance="cost", bucket=bucket)
            h.update(plan.epoch(1).ids.tobytes())
    assert (PLANNER_VERSION, h.hexdigest()[:16]) == (4, "b41dd2a51ebc1b63"), \
        "cost plans changed: raise PLANNER_VERSION, then record the new version and digest here"


@pytest.mark.parametrize("shape", [(200, 8), (1562, 12), (100, 8), (300, 13), (500, 1), (0, 4), (64, 2)])
def test_row_max_is_numpys_row_maximum(shape):
    from evenflow.plan.assign.cost_refine import row_max

    a = np.random.default_rng(0).lognormal(0, 1, shape)
    if a.size:
        a[0, -1] = np.inf
        a[-1, 0] = 0.0
    assert np.array_equal(row_max(a), a.max(axis=1))
