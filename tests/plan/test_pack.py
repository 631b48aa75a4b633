"""Packed plans: samples in rows of at most L tokens, packs split equally among replicas."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import evenflow as ef
from evenflow.testing import assert_exactly_once, assert_resumes_identically


def _lengths(n, seed=0, top=512):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(4.5, 1.0, n).round(), 1, top).astype(np.int64)


def _row_tokens(ep, lengths):
    """tokens per (step, replica, row), and the piece lengths found in each row."""
    out = np.zeros((ep.num_steps, ep.replicas, ep.rows), np.int64)
    s, r, j = np.nonzero(ep.ids >= 0)
    piece = np.minimum(lengths[ep.ids[s, r, j]] - ep.starts[s, r, j], ep.pack_length)
    np.add.at(out, (s, r, ep.row[s, r, j]), piece)
    return out


@pytest.mark.parametrize("balance", ["count", "cost"])
def test_packs_are_full_equal_and_exactly_once(balance):
    lengths = _lengths(5000)
    plan = ef.Plan(ef.Index(5000, costs=lengths), ef.Topology(4), global_batch_size=32, pack=512, balance=balance)
    assert plan.layout.efficiency >= 0.98  # best fit decreasing on long-tailed lengths
    for epoch in (0, 1):
        ep = plan.epoch(epoch)
        assert ep.num_steps == plan.num_steps and ep.rows == plan.rows == 8
        rows = _row_tokens(ep, lengths)
        assert rows.max() <= 512
        # Equal pack counts: every replica fills all 8 rows in each full step.
        full = ep.ids.shape[0] - (plan.layout.num_packs % 32 != 0)
        assert (rows[:full] > 0).sum(axis=2).min() == 8
        assert_exactly_once(plan, epoch)
    # Which samples share a pack changes between epochs; the layout (and the step count) does not.
    a, b = plan.epoch(0), plan.epoch(1)
    assert not np.array_equal(a.ids, b.ids)


def test_rows_hold_pieces_back_to_back_in_slot_order():
    lengths = _lengths(800, seed=3)
    ep = ef.Plan(ef.Index(800, costs=lengths), ef.Topology(2), global_batch_size=8, pack=300,
                 pack_overflow="split").epoch(0)
    for s in range(ep.num_steps):
        for r in range(ep.replicas):
            real = ep.ids[s, r] >= 0
            assert not real[real.sum():].any()  # real slots first
            rows = ep.row[s, r, real]
            assert np.all(np.diff(rows) >= 0)  # a row's pieces are consecutive slots


@given(n=st.integers(1, 3000), r=st.integers(1, 9), g_extra=st.integers(0, 20), top=st.integers(1, 900),
       pack=st.integers(16, 600), seed=st.integers(0, 2**31), weighted=st.booleans(),
       balance=st.sampled_from(["count", "cost"]), drop=st.booleans())
@settings(max_examples=20, deadline=None)
# The dropped partial step holds more pieces than any kept step: only its packs count.
@example(n=136, r=1, g_extra=17, top=101, pack=97, seed=2535, weighted=False, balance="count", drop=True)
def test_pack_invariants(n, r, g_extra, top, pack, seed, weighted, balance, drop):
    """Exactly once, deterministic, resumable and world-size invariant, on random lengths and topologies."""
    lengths = _lengths(n, seed, top)
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.3, 1.0, r) if weighted else None
    index = ef.Index(n, costs=lengths)
    topo = ef.Topology(r, weights=weights)
    g = r + g_extra
    try:
        plan = ef.Plan(index, topo, global_batch_size=g, seed=seed % 1000, pack=pack, pack_overflow="split",
                       balance=balance, drop_remainder=drop, pack_attention=0.01)
    except ValueError as e:
        assert "fewer packs than one global batch" in str(e)
        return
    assert_exactly_once(plan, 1)
    ep = plan.epoch(1)
    assert _row_tokens(ep, lengths).max() <= pack
    assert np.array_equal(ep.ids, plan.epoch(1).ids)  # deterministic
    step = int(rng.integers(0, plan.num_steps + 1))
    assert_resumes_identically(plan, 1, step)
    rest = plan.epoch(1, start=ef.Cursor(1, step))
    assert np.array_equal(rest.row, ep.row[step:]) and np.array_equal(rest.starts, ep.starts[step:])
    # World-size invariant: another topology keeps each step's pieces.
    o = plan.with_topology(ef.Topology(r - 1 if r > 1 else min(2, g))).epoch(1)
    for s in range(ep.num_steps):
        key = lambda e: np.sort((e.ids[s] * 10**6 + e.starts[s])[e.ids[s] >= 0])  # noqa: E731
        assert np.array_equal(key(ep), key(o))


def test_split_pieces_cover_every_token_once():
    lengths = np.array([5, 700, 250, 1000, 100], np.int64)
    plan = ef.Plan(ef.Index(5, costs=lengths), ef.Topology(1), global_batch_size=2, pack=256,
                   pack_overflow="split")
    ep = plan.epoch(0)
    real = ep.ids >= 0
    covered = {}
    for i, start in zip(ep.ids[real].tolist(), ep.starts[real].tolist()):
        covered.setdefault(i, []).append(start)
    for i, n in enumerate(lengths.tolist()):
        assert sorted(covered[i]) == list(range(0, n, 256))


def test_cost_balance_evens_out_attention_cost():
    lengths = _lengths(6000, seed=5)
    index, topo = ef.Index(6000, costs=lengths), ef.Topology(4)
    spread = {}
    for balance in ("count", "cost"):
        plan = ef.Plan(index, topo, global_batch_size=32, pack=512, balance=balance, pack_attention=1 / 64)
        ep = plan.epoch(0)
        real = ep.ids >= 0
        piece = np.where(real, np.minimum(lengths[np.maximum(ep.ids, 0)] - ep.starts, 512), 0).astype(float)
        load = (piece + piece ** 2 / 64).sum(axis=2)[:-1]  # full steps
        spread[balance] = float((load.max(axis=1) / load.mean(axis=1)).mean())
    assert spread["cost"] < spread["count"]
    assert spread["cost"] <= 1.02


def test_refusals_name_the_rule_and_the_fix():
    index = ef.Index(3, costs=np.array([10, 600, 20]))
    with pytest.raises(ValueError, match=r"1 of 3 samples are longer than the pack length 512.*sample 1.*600.*split"):
        ef.Plan(index, ef.Topology(1), global_batch_size=1, pack=512)
    with pytest.raises(ValueError, match="cannot be combined with bucket=True"):
        ef.Plan(index, ef.Topology(1), global_batch_size=1, pack=512, bucket=True)
    with pytest.raises(ValueError, match="cannot be combined with stratify=True"):
        ef.PlanOptions(global_batch_size=1, pack=512, stratify=True)
    with pytest.raises(ValueError, match="integer >= 1.*sample 0 has cost 1.5"):
        ef.Plan(ef.Index(2, costs=np.array([1.5, 2.0])), ef.Topology(1), global_batch_size=1, pack=8)
    with pytest.raises(ValueError, match="needs each sample's length in tokens"):
        ef.Plan(ef.Index(2), ef.Topology(1), global_batch_size=1, pack=8)
    with pytest.raises(ValueError, match="pack_overflow must be one of error, split"):
        ef.PlanOptions(global_batch_size=1, pack=8, pack_overflow="truncate")
    with pytest.raises(ValueError, match="pack_attention must be at least 0"):
        ef.PlanOptions(global_batch_size=1, pack=8, pack_attention=-1)
    with pytest.raises(ValueError, match="fewer packs than one global batch"):
        ef.Plan(index, ef.Topology(1), global_batch_size=5, pack=1024, drop_remainder=True)


def test_token_counts_too_large_to_pack_are_refused_before_any_layout():
    with pytest.raises(ValueError, match=r"sample 0 has 1e\+19 tokens, and a token count must be below 2\*\*53"):
        ef.Plan(ef.Index(3, costs=[1e19, 5, 5]), ef.Topology(1), global_batch_size=1, pack=16)
    with pytest.raises(ValueError, match=r"would cut the samples into 6.25e\+10 pieces, more than 2,147,483,648 "
                                         r"\(sample 0 alone has 1e\+12 tokens\)"):
        ef.Plan(ef.Index(3, costs=[1e12, 5, 5]), ef.Topology(1), global_batch_size=1, pack=16, pack_overflow="split")
