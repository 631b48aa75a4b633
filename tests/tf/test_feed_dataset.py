"""PlanReader.feed_dataset: a plan's rows from a PlanFeed, switched mid-stream, read ahead within the feed's bound."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import evenflow as ef
import evenflow.plan.feed as feed_module
from evenflow.plan.feed import PlanFeed

tf = pytest.importorskip("tensorflow")
from evenflow.tf import ArraySource, PlanReader  # noqa: E402

N, G, R = 47, 12, 3


@pytest.fixture(scope="module")
def source():
    rng = np.random.default_rng(0)
    return ArraySource(rng.normal(size=(N, 3)).astype(np.float32), rng.integers(0, 4, size=N))


def _real(ids):
    return ids[ids >= 0]


@pytest.mark.parametrize("replicas", [1, range(0, 3)])
def test_a_switch_lands_within_the_lead_of_a_paced_consumer_and_every_row_is_the_plans(source, monkeypatch,
                                                                                       replicas):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(feed_module, "time", SimpleNamespace(monotonic=lambda: clock.now))
    old = ef.Plan(source.index(), ef.Topology(R), global_batch_size=G, seed=1)
    new = ef.Plan(source.index(), ef.Topology(R, (1.0, 0.5, 0.25)), global_batch_size=G, seed=1)
    steps, epochs = old.num_steps, 8
    feed = PlanFeed(old, ef.Cursor(0, 0), end_epoch=epochs, block=True)
    it = iter(PlanReader(source).feed_dataset(feed, replicas))
    rows = [replicas] if isinstance(replicas, int) else list(replicas)
    got, at = [], None
    for g in range(steps * epochs):
        feed.advance(g)  # a consumer of 0.1 s steps: the feed serves 3 steps past it
        # A worker's dataset holds one element per replica and step, its replicas in order.
        got.append(np.stack([next(it)["id"].numpy() for _ in rows]))
        clock.now += 0.1
        if g == 20:
            at = feed.freeze()
            feed.switch(new, at)
            feed.thaw()
    assert feed.lead == 3
    assert 21 <= at <= 20 + feed.lead + 1  # the switch lands right after the rows already served
    with pytest.raises(StopIteration):
        next(it)
    for g, ids in enumerate(got):
        plan = old if g < at else new
        epoch, step = divmod(g, steps)
        start = ef.Cursor(epoch, at % steps) if plan is new and epoch == at // steps else None
        row = plan.epoch(epoch, start=start).ids[step - (start.step if start else 0)]
        for k, r in enumerate(rows):
            assert np.array_equal(_real(ids[k]), _real(row[r])), (g, r)
        if len(rows) == R and step == steps - 1:  # every sample of the epoch once, whatever the split
            seen = np.concatenate([_real(x) for x in got[epoch * steps:(epoch + 1) * steps]])
            assert np.array_equal(np.sort(seen), np.arange(N))


def test_without_reports_the_pipeline_reads_whole_blocks_to_the_end(source):
    plan = ef.Plan(source.index(), ef.Topology(R), global_batch_size=G, seed=1)
    feed = PlanFeed(plan, ef.Cursor(1, 2), end_epoch=3, block=True)
    got = [b["id"].numpy() for b in PlanReader(source).feed_dataset(feed, 2)]
    want = np.concatenate([plan.epoch(1, start=ef.Cursor(1, 2)).ids[:, 2], plan.epoch(2).ids[:, 2]])
    assert len(got) == len(want) and feed.lead is None
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
