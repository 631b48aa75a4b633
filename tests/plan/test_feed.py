"""PlanFeed: a plan's rows step by step, switching weights from a step no reader has reached."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import evenflow as ef
from evenflow.plan.feed import FeedClosed, PlanFeed


def _plan(weights=None, **kw):
    index = ef.Index(1000, labels=np.arange(1000) % 7, costs=1 + np.arange(1000) % 13)
    return ef.Plan(index, ef.Topology(3, weights), global_batch_size=96, seed=3, **kw)


def _read(feed, first, end, replica):
    return [feed.rows(g, replica) for g in range(first, end)]


@pytest.mark.parametrize("options", [{}, {"stratify": True}, {"balance": "cost"}, {"balance": "cost", "bucket": True}])
def test_rows_are_the_plans_and_a_switch_changes_only_the_split_of_later_steps(options):
    old, new = _plan(**options), _plan((1.0, 0.5, 0.25), **options)
    steps = old.num_steps
    feed = PlanFeed(old, ef.Cursor(1, 3), end_epoch=3, block=False)
    at = 2 * steps + 4  # epoch 2, step 4
    before = _read(feed, steps + 3, steps + 5, None)
    feed.switch(new, at)
    got = _read(feed, steps + 3, 3 * steps, None)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(before, got))
    expect = [old.epoch(1).ids[s].reshape(-1) for s in range(3, steps)] + \
        [old.epoch(2).ids[s].reshape(-1) for s in range(4)] + \
        [new.epoch(2, ef.Cursor(2, 4)).ids[s].reshape(-1) for s in range(steps - 4)]
    assert len(got) == len(expect)
    for (ids, count, epoch), want in zip(got, expect):
        assert np.array_equal(ids, want)
        assert count == (want >= 0).sum()
    # Exactly once per epoch across the switch: every sample of epoch 2 once.
    seen = np.concatenate([ids[ids >= 0] for ids, _, e in got if e == 2])
    assert np.array_equal(np.sort(seen), np.arange(1000))
    # Per replica, and a worker's range of replicas, agree with the whole step.
    g = 2 * steps + 6
    ids, count, epoch = feed.rows(g, range(1, 3))
    assert ids.shape[0] == 2 and list(count) == [count[0]] * 2 and list(epoch) == [2, 2]
    assert np.array_equal(ids[1], feed.rows(g, 2)[0])


def test_a_switch_must_come_after_every_step_read():
    feed = PlanFeed(_plan(), ef.Cursor(0, 0), end_epoch=1, block=False)
    feed.rows(3, 0)
    assert feed.freeze() == 4  # the first step not read
    with pytest.raises(RuntimeError, match="after step 3 was read"):
        feed.switch(_plan((1, 1, 0.5)), 3)
    feed.switch(_plan((1, 1, 0.5)), 4)
    with pytest.raises(ValueError, match="steps per epoch"):
        feed.switch(ef.Plan(ef.Index(1000), ef.Topology(3), global_batch_size=50), 5)


def test_a_frozen_feed_holds_new_requests_until_thawed_or_closed():
    plan = _plan()
    eager = PlanFeed(plan, ef.Cursor(0, 0), end_epoch=1, block=False)
    eager.rows(1, 0)
    eager.freeze()
    assert eager.rows(1, 1)[0].shape == (plan.slots,)  # a step already read is served
    with pytest.raises(RuntimeError, match="frozen for a switch"):
        eager.rows(2, 0)
    eager.thaw()
    assert eager.rows(2, 0)[0].shape == (plan.slots,)
    with pytest.raises(IndexError, match="outside"):
        eager.rows(plan.num_steps, 0)

    waiting = PlanFeed(plan, ef.Cursor(0, 0), end_epoch=1, block=True)
    waiting.freeze()
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("rows", waiting.rows(3, 1)))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive() and "rows" not in got  # held while frozen
    waiting.switch(_plan((1.0, 0.5, 1.0)), 2)
    waiting.thaw()
    reader.join(5)
    assert np.array_equal(got["rows"][0], _plan((1.0, 0.5, 1.0)).epoch(0, ef.Cursor(0, 2)).ids[1, 1])

    closed = PlanFeed(plan, ef.Cursor(0, 0), end_epoch=1, block=True)
    closed.freeze()
    errors = []

    def blocked():
        try:
            closed.rows(2, 0)
        except FeedClosed as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    closed.close()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1


@pytest.mark.parametrize("replicas", [1, range(0, 2), None])
def test_a_block_of_steps_is_the_rows_of_each_and_a_switch_lands_after_it(replicas):
    old, new = _plan(), _plan((1.0, 0.5, 0.25))
    steps = old.num_steps
    feed = PlanFeed(old, ef.Cursor(0, 2), end_epoch=2, block=False)
    ids, counts, epochs = feed.rows_block(steps - 2, 4, replicas)  # across the epoch boundary
    single = PlanFeed(old, ef.Cursor(0, 2), end_epoch=2, block=False)
    for k, g in enumerate(range(steps - 2, steps + 2)):
        want = single.rows(g, replicas)
        assert np.array_equal(ids[k], want[0]) and np.array_equal(counts[k], want[1])
        assert np.array_equal(epochs[k], want[2])
    assert feed.freeze() == steps + 2  # the whole block was served
    feed.switch(new, steps + 2)
    feed.thaw()
    tail = feed.rows_block(2 * steps - 3, 8, replicas)[0]  # clipped at the feed's end
    assert tail.shape[0] == 3
    assert np.array_equal(tail[-1], PlanFeed(new, ef.Cursor(1, 0), 2, block=False).rows(2 * steps - 1, replicas)[0])
    with pytest.raises(ValueError, match="k >= 1"):
        feed.rows_block(steps + 3, 0, replicas)


def test_a_block_across_plans_of_different_widths_is_padded_with_minus_one():
    old, new = _plan(), _plan((1.0, 0.3, 0.3))
    assert new.slots > old.slots
    feed = PlanFeed(old, ef.Cursor(0, 0), end_epoch=1, block=False)
    feed.switch(new, 2)  # nothing read yet: steps 0-1 under the old plan, 2-3 under the new
    ids, counts, _ = feed.rows_block(0, 4, 0)
    assert ids.shape == (4, new.slots)
    assert np.all(ids[:2, old.slots:] == -1)
    assert np.array_equal(ids[:2, :old.slots], old.epoch(0).ids[:2, 0])
    assert np.array_equal(ids[2:], new.epoch(0, ef.Cursor(0, 2)).ids[:2, 0])


class _Clock:
    """A stand-in for time.monotonic: the feed's pace comes from its consumer's reports."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _paced(monkeypatch, per_step: float, steps: int = 3, **kw):
    """A feed of replica 0 whose consumer reported steps 0..steps-1, ``per_step`` seconds apart."""
    import evenflow.plan.feed as feed_module
    clock = _Clock()
    monkeypatch.setattr(feed_module, "time", SimpleNamespace(monotonic=clock))
    feed = PlanFeed(_plan(), ef.Cursor(0, 0), end_epoch=2, **kw)
    for g in range(steps):
        feed.advance(g)
        clock.now += per_step
    return feed, clock


def test_a_consumer_of_long_steps_bounds_the_read_ahead_to_its_lead(monkeypatch):
    feed, clock = _paced(monkeypatch, 0.1, block=False)
    assert feed.lead == 3  # ceil(0.25 s / 0.1 s per step)
    ids, _, _ = feed.rows_block(0, 4, 0)
    assert len(ids) == 4
    ids, _, _ = feed.rows_block(4, 4, 0)  # the consumer is at step 2: up to step 5, two of the four
    assert len(ids) == 2
    assert np.array_equal(ids[1], feed.rows(5, 0)[0])
    with pytest.raises(RuntimeError, match="call advance"):  # asked from the consumer's own thread
        feed.rows_block(6, 4, 0)
    feed.advance(3)
    assert len(feed.rows_block(6, 4, 0)[0]) == 1
    assert feed.freeze() == 7  # a switch decided now lands 4 steps after the consumer's step
    feed.thaw()


def test_a_held_request_is_served_when_the_consumer_moves_on(monkeypatch):
    feed, clock = _paced(monkeypatch, 0.3, block=True)
    assert feed.lead == 2  # MIN_LEAD: ceil(0.25 / 0.3) is 1
    feed.rows_block(0, 4, 0)  # steps 0-3: the consumer is at 2, its lead 2
    got = []
    t = threading.Thread(target=lambda: got.append(feed.rows_block(5, 4, 0)))
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and not got  # step 5 is 3 past the consumer
    feed.advance(3)
    t.join(5)
    assert not t.is_alive() and len(got[0][0]) == 1


def test_short_steps_are_not_bounded_and_the_end_of_the_feed_is_an_empty_block(monkeypatch):
    feed, _ = _paced(monkeypatch, 0.01, block=False)
    assert feed.lead is None  # under BOUND_STEP_SECONDS: as deep as the pipelines read
    assert len(feed.rows_block(0, 8, 0)[0]) == 8
    ids, counts, epochs = feed.rows_block(feed.end, 4, range(0, 2))
    assert ids.shape == (0, 2, 0) and counts.shape == (0, 2) and epochs.shape == (0, 2)
    assert feed.rows_block(feed.end, 4, 1)[0].shape == (0, 0)
    with pytest.raises(IndexError, match="outside"):
        feed.rows_block(feed.end + 1, 4, 1)


def test_a_step_that_waited_for_its_input_doubles_the_lead_for_good(monkeypatch):
    feed, clock = _paced(monkeypatch, 0.1, block=False)
    feed.waited(0.005)  # under a tenth of a step: noise
    assert feed.lead == 3
    feed.waited(0.02)
    assert feed.lead == 6
    feed.advance(3)  # the pace alone would give 3 again
    clock.now += 0.1
    feed.advance(4)
    assert feed.lead == 6
    assert len(feed.rows_block(0, 16, 0)[0]) == 11  # up to step 4 + 6


def test_a_feed_whose_consumer_never_reports_serves_whole_blocks():
    feed = PlanFeed(_plan(), ef.Cursor(0, 0), end_epoch=2, block=False)
    feed.waited(1.0)  # no pace, no bound: nothing to relax
    assert feed.lead is None and len(feed.rows_block(0, 4, 0)[0]) == 4


def test_a_paced_feed_bounds_the_read_ahead_before_the_consumers_first_report():
    feed = PlanFeed(_plan(), ef.Cursor(0, 3), end_epoch=2, block=False, paced=True)
    assert feed.lead == 2
    ids, _, _ = feed.rows_block(3, 4, 0)  # the consumer is before step 3: steps 3 and 4
    assert len(ids) == 2
    assert feed.freeze() == 5  # a re-plan decided at the first step lands 2 steps in
    feed.thaw()


def test_a_consumer_that_stops_reading_lifts_the_bound_until_its_next_report(monkeypatch):
    import evenflow.plan.feed as feed_module
    monkeypatch.setattr(feed_module, "LEAD_PATIENCE", 0.3)  # an evaluation, or a stream dropped on an error
    feed, clock = _paced(monkeypatch, 0.3, block=True)
    feed.rows_block(0, 4, 0)  # up to step 2 + 2
    got = []
    t = threading.Thread(target=lambda: got.append(feed.rows_block(5, 4, 0)))
    t.start()
    t.join(5)
    assert not t.is_alive() and len(got[0][0]) == 4  # served after the patience, and unbounded since
    assert len(feed.rows_block(9, 8, 0)[0]) == 8
    feed.advance(3)  # the consumer is back: so is the bound
    done = []

    def ask():
        try:
            done.append(feed.rows_block(17, 4, 0))
        except FeedClosed as e:
            done.append(e)

    t = threading.Thread(target=ask)
    t.start()
    time.sleep(0.1)
    assert t.is_alive() and not done
    feed.close()
    t.join(5)
    assert not t.is_alive() and isinstance(done[0], FeedClosed)
