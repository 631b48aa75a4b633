"""``evenflow.testing``'s checks fail on the plans they promise to catch (an epoch's ids altered after planning)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import evenflow as ef
from evenflow.testing import assert_exactly_once, assert_resumes_identically


def altered(plan, change, resumed_only: bool = False):
    """``plan`` whose epochs (or only those read from a start cursor) come back with ``change`` applied
    to a copy of each field it names."""
    planned = plan.epoch

    def epoch(e, start=None, stop=None):
        ep = planned(e, start, stop)
        if resumed_only and start is None:
            return ep
        return dataclasses.replace(ep, **{name: fn(getattr(ep, name).copy()) for name, fn in change.items()})

    plan.epoch = epoch
    return plan


def first_real(value):
    def fn(ids):
        flat = ids.reshape(-1)
        flat[np.flatnonzero(flat >= 0)[0]] = value
        return ids
    return fn


@pytest.mark.parametrize("drop", [False, True])
def test_an_id_outside_the_index_and_a_missing_one_are_named(drop):
    plan = altered(ef.Plan(ef.Index(100), ef.Topology(2), global_batch_size=16, drop_remainder=drop),
                   {"ids": first_real(10_000)})
    with pytest.raises(AssertionError, match=r"plans ids that are no sample of the index \(0..99\): \[10000\]"):
        assert_exactly_once(plan, 0)
    plan = altered(ef.Plan(ef.Index(100), ef.Topology(2), global_batch_size=16), {"ids": first_real(-1)})
    with pytest.raises(AssertionError, match=r"99 real ids, 0 duplicated .*1 missing \(e.g. \[\d+\]\)"):
        assert_exactly_once(plan, 0)


def packed(drop: bool):
    """Samples of 1-149 tokens in rows of 64: the longer ones split into pieces that start past 0."""
    index = ef.Index(200, costs=np.random.default_rng(0).integers(1, 150, 200).astype(float))
    return ef.Plan(index, ef.Topology(2), global_batch_size=4, pack=64, pack_overflow="split", drop_remainder=drop)


def test_a_packed_plan_missing_a_whole_step_fails_even_with_drop_remainder():
    assert_exactly_once(packed(True), 0)  # as planned: only the last partial step's pieces are left out

    def blank_first_step(ids):
        ids[0] = -1
        return ids

    with pytest.raises(AssertionError, match="does not plan every piece exactly once"):
        assert_exactly_once(altered(packed(True), {"ids": blank_first_step}), 0)


def test_a_packed_resume_compares_where_each_piece_starts_and_its_row():
    assert_resumes_identically(packed(False), 0, 3)
    with pytest.raises(AssertionError, match="differs from the uninterrupted plan in its starts"):
        assert_resumes_identically(altered(packed(False), {"starts": np.zeros_like}, True), 0, 3)
    with pytest.raises(AssertionError, match="differs from the uninterrupted plan in its row"):
        assert_resumes_identically(altered(packed(False), {"row": lambda r: np.where(r > 0, 0, r)}, True), 0, 3)


def test_a_plan_that_is_not_one_is_named():
    for check in (lambda: assert_exactly_once(None, 0), lambda: assert_resumes_identically(ef.Index(3), 0, 0)):
        with pytest.raises(TypeError, match="plan must be an evenflow Plan, got"):
            check()
