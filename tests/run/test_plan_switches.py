"""The training loop switches plans in its open stream: any number of re-plans, every sample once per epoch.

A framework-free engine runs the real :class:`~evenflow.run.loop.TrainLoop`: its stream reads
rows from a :class:`~evenflow.plan.feed.PlanFeed` the way the torch sampler does (never ahead of
training), and a scripted monitor decides new weights at chosen steps.
"""
from __future__ import annotations

import numpy as np

import evenflow as ef
from evenflow.plan.feed import PlanFeed
from evenflow.plan.speed.rebalancer import Decision
from evenflow.run.engine import Stream
from evenflow.run.loop import TrainLoop


class FeedEngine:
    """Trains nothing; returns each step's ids and counts. Its stream reads ``ahead`` steps before training."""

    lag, timing, skip_nonfinite, num_processes, can_switch = 0, True, False, 1, True

    def __init__(self, replicas: int, ahead: int):
        self.local_replicas, self.ahead = replicas, ahead
        self.opened = 0

    def open(self, reader, plan, start, epochs, switchable=False):
        self.opened += 1
        feed = PlanFeed(plan, start, start.epoch + epochs, block=False) if switchable else None

        def rows():
            for g in range(start.epoch * plan.num_steps + start.step, (start.epoch + epochs) * plan.num_steps):
                yield feed.rows(g, None)[0].reshape(plan.topology.replicas, -1) if feed is not None else \
                    plan.epoch(g // plan.num_steps).ids[g % plan.num_steps]

        it = rows()
        buffer = [next(it, None) for _ in range(self.ahead)]  # what a prefetching reader has in hand
        return Stream(_Ahead(it, buffer), feed)

    def update(self, stream, global_step, count, keep_batches):
        outs = []
        for _ in range(count):
            ids = next(stream.iterator)
            real = (ids >= 0).sum(axis=1).astype(float)
            outs.append({"sums": np.column_stack([real, real, real]), "flags": np.zeros((len(ids), 3)),
                         "ids": ids, "timing": np.zeros((len(ids), 5))})
        return outs, None

    def read(self, out, with_ids):
        return out

    def sums(self, outs):
        return sum(o["sums"] for o in outs)

    def close(self, stream, finished):
        if stream.feed is not None:
            stream.feed.close()

    def all_gather(self, rows):
        return rows


class _Ahead:
    def __init__(self, it, buffer):
        self.it, self.buffer = it, [b for b in buffer if b is not None]

    def __iter__(self):
        return self

    def __next__(self):
        nxt = next(self.it, None)  # keep `ahead` rows in hand, as a prefetch buffer does
        if nxt is not None:
            self.buffer.append(nxt)
        if not self.buffer:
            raise StopIteration
        return self.buffer.pop(0)


class ScriptedMonitor:
    """Decides ``weights[i]`` at the i-th global step in ``at``; records the ids of every step."""

    needs_ids, rebalancing = True, True

    def __init__(self, replicas, at, weights):
        self.at, self.new = list(at), list(weights)
        self.weights = tuple([1.0] * replicas)
        self.rebalancer = type("R", (), {"weights": self.weights})()
        self.global_step, self.total_steps = 0, None
        self.steps_per_epoch = None
        self.seen, self.events, self._due = {}, [], None

    def stream_opened(self, seconds):
        pass

    def record(self, epoch, step, row):
        self.seen[(epoch, step)] = row["ids"].copy()
        self.global_step += 1
        self._due = self.global_step

    def due(self, end_of_epoch):
        return self._due is not None

    def window(self):
        return np.zeros((1, 1))

    def absorb(self, gathered, end_of_epoch=False):
        g, self._due = self._due, None
        if self.at and g >= self.at[0]:
            self.at.pop(0)
            w = tuple(self.new.pop(0))
            return Decision(w, (1.0,) * len(w), 1.5, 1.5, 1.0, "replan")
        return None

    def switching(self):
        self.events.append(("switching", self.global_step))

    def replanned(self, cursor, before, decision):
        self.events.append(("replanned", cursor, decision.weights))

    def drop(self):
        pass


def test_many_switches_in_one_stream_keep_every_sample_once_per_epoch_and_follow_the_weights():
    index = ef.Index(500, labels=np.arange(500) % 5)
    plan = ef.Plan(index, ef.Topology(3), global_batch_size=40, seed=1, stratify=True)
    steps = plan.num_steps  # 13: the last step holds 20
    weights = [(1.0, 0.5, 0.25), (0.25, 1.0, 1.0), (1.0, 1.0, 1.0), (0.1, 1.0, 0.1), (1.0, 0.2, 1.0)]
    monitor = ScriptedMonitor(3, at=[2, 6, 12, 20, 27], weights=weights)
    engine = FeedEngine(3, ahead=3)
    loop = TrainLoop(engine, 1)
    loop.fit(None, plan, epochs=3, monitor=monitor)
    assert engine.opened == 1  # five re-plans, no reopening
    assert len(loop.replans) == 5
    # Each switch took effect at the first step the stream had not read: the decision's step plus the
    # rows the reader holds in hand (3).
    starts = [c.epoch * steps + c.step for c, _ in loop.replans]
    decided = [e[1] for e in monitor.events if e[0] == "switching"]
    assert starts == [d + 3 for d in decided]
    for e in range(3):
        ids = np.concatenate([monitor.seen[(e, s)].reshape(-1) for s in range(steps)])
        assert np.array_equal(np.sort(ids[ids >= 0]), np.arange(500))  # exactly once per epoch
        for s in range(steps):  # and each step holds the plan's samples, whoever got them
            step_ids = monitor.seen[(e, s)]
            assert np.array_equal(np.sort(step_ids[step_ids >= 0]), np.sort(plan.epoch(e).step_ids(s)))
    # Every step's split is the plan of the weights in effect at that step.
    bounds = starts + [3 * steps]
    current = plan
    for k in range(3 * steps):
        for i, start in enumerate(starts):
            if k == start:
                current = plan.with_topology(ef.Topology(3, weights[i]))
        e, s = divmod(k, steps)
        got = monitor.seen[(e, s)]
        want = current.epoch(e).ids[s]
        real_got = [np.sort(r[r >= 0]) for r in got]
        real_want = [np.sort(r[r >= 0]) for r in want]
        assert all(np.array_equal(a, b) for a, b in zip(real_got, real_want)), (k, bounds)
