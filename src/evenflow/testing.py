"""Checks users can run on their own plans and pipelines (no framework needed)."""
from __future__ import annotations

import numpy as np

from evenflow.plan import Cursor, Plan, Topology

__all__ = ["assert_exactly_once", "assert_resumes_identically"]


def assert_exactly_once(plan: Plan, epoch: int) -> None:
    """Raise AssertionError unless the epoch's real ids are exactly ``0..N-1`` (or a full-step subset).

    For a packed plan that splits long samples, each piece (sample id, start token) counts once.
    """
    ep = plan.epoch(epoch)
    if plan.options.pack:
        _assert_pieces_once(plan, ep)
        return
    ids = np.sort(ep.ids[ep.ids >= 0])
    if plan.options.drop_remainder:
        ok = np.unique(ids).shape[0] == ids.shape[0] == ep.num_steps * plan.options.global_batch_size
    else:
        ok = np.array_equal(ids, np.arange(plan.index.num_samples))
    if not ok:
        dup = ids[1:][ids[1:] == ids[:-1]]
        raise AssertionError(f"epoch {epoch} is not exactly-once: {ids.shape[0]} real ids, "
                             f"{np.unique(dup).shape[0]} duplicated (e.g. {dup[:5].tolist()})")


def assert_resumes_identically(plan: Plan, epoch: int, step: int, topology: Topology | None = None) -> None:
    """Raise AssertionError unless resuming at ``Cursor(epoch, step)`` continues the epoch exactly.

    With the plan's own topology the remainder must equal ``epoch(epoch).ids[step:]``; with another
    ``topology`` every remaining global step must hold the same ids.
    """
    full = plan.epoch(epoch)
    target = plan if topology is None else plan.with_topology(topology)
    rest = target.epoch(epoch, start=Cursor(epoch, step))
    if topology is None:
        if not np.array_equal(rest.ids, full.ids[step:]):
            raise AssertionError(f"resuming epoch {epoch} at step {step} differs from the uninterrupted plan")
        return
    if rest.num_steps != full.num_steps - step:
        raise AssertionError(f"resumed plan has {rest.num_steps} steps, expected {full.num_steps - step}")
    for i in range(rest.num_steps):
        if not np.array_equal(rest.step_ids(i), full.step_ids(step + i)):
            raise AssertionError(f"global step {step + i} holds different ids after changing the topology")


def _assert_pieces_once(plan: Plan, ep) -> None:
    layout = plan.layout
    real = ep.ids >= 0
    width = int(layout.start.max()) + 1 if layout.start.size else 1
    got = np.sort(ep.ids[real] * width + ep.starts[real])
    want = np.sort(layout.sample * width + layout.start)
    dup = got[1:][got[1:] == got[:-1]]
    if dup.size:
        raise AssertionError(f"epoch {ep.epoch} plans {dup.size} pieces twice (e.g. sample {int(dup[0] // width)})")
    if plan.options.drop_remainder:
        ok = np.isin(got, want).all() and got.shape[0] >= want.shape[0] - plan.options.global_batch_size * plan.slots
    else:
        ok = np.array_equal(got, want)
    if not ok:
        raise AssertionError(f"epoch {ep.epoch} does not plan every piece exactly once: {got.shape[0]} planned, "
                             f"{want.shape[0]} pieces")
