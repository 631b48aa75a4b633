"""Checks users can run on their own plans and pipelines (no framework needed)."""
from __future__ import annotations

import numpy as np

from evenflow.plan import Cursor, Plan, Topology


def assert_exactly_once(plan: Plan, epoch: int) -> None:
    """Raise AssertionError unless the epoch's real ids are exactly ``0..N-1`` (or a full-step subset).

    For a packed plan that splits long samples, each piece (sample id, start token) counts once.
    """
    _check_plan(plan)
    ep = plan.epoch(epoch)
    if plan.options.pack:
        _assert_pieces_once(plan, ep)
        return
    ids = np.sort(ep.ids[ep.ids >= 0])
    n = plan.index.num_samples
    outside = ids[ids >= n]
    if outside.size:
        raise AssertionError(f"epoch {epoch} plans ids that are no sample of the index (0..{n - 1}): "
                             f"{np.unique(outside)[:5].tolist()}")
    if plan.options.drop_remainder:
        ok = np.unique(ids).shape[0] == ids.shape[0] == ep.num_steps * plan.options.global_batch_size
    else:
        ok = np.array_equal(ids, np.arange(n))
    if not ok:
        dup = ids[1:][ids[1:] == ids[:-1]]
        missing = np.setdiff1d(np.arange(n), ids) if not plan.options.drop_remainder else np.zeros(0, np.int64)
        raise AssertionError(f"epoch {epoch} is not exactly-once: {ids.shape[0]} real ids, "
                             f"{np.unique(dup).shape[0]} duplicated (e.g. {dup[:5].tolist()}), "
                             f"{missing.shape[0]} missing (e.g. {missing[:5].tolist()})")


def _check_plan(plan) -> None:
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")


def assert_resumes_identically(plan: Plan, epoch: int, step: int, topology: Topology | None = None) -> None:
    """Raise AssertionError unless resuming at ``Cursor(epoch, step)`` continues the epoch exactly.

    With the plan's own topology the remainder must equal ``epoch(epoch).ids[step:]``; with another
    ``topology`` every remaining global step must hold the same ids.
    """
    _check_plan(plan)
    full = plan.epoch(epoch)
    target = plan if topology is None else plan.with_topology(topology)
    rest = target.epoch(epoch, start=Cursor(epoch, step))
    if topology is None:
        # A packed plan's pieces are also where each starts in its sample and which row holds it.
        for name in ("ids", "starts", "row") if plan.options.pack else ("ids",):
            if not np.array_equal(getattr(rest, name), getattr(full, name)[step:]):
                raise AssertionError(f"resuming epoch {epoch} at step {step} differs from the uninterrupted plan "
                                     f"in its {name}")
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
        # Only the packs of the last, partial step may be left out (num_packs % G of them, however
        # many pieces they hold), and every step kept holds pieces. A pack is a (step, replica, row).
        per_step = real.reshape(ep.num_steps, -1).sum(axis=1)
        steps, replicas, _ = np.nonzero(real)
        rows = int(ep.row.max(initial=-1)) + 1
        packs = np.unique((steps * ep.ids.shape[1] + replicas) * max(rows, 1) + ep.row[real]).size
        kept = layout.num_packs - layout.num_packs % plan.options.global_batch_size
        ok = np.isin(got, want).all() and bool(per_step.min(initial=1) > 0) and packs == kept
    else:
        ok = np.array_equal(got, want)
    if not ok:
        raise AssertionError(f"epoch {ep.epoch} does not plan every piece exactly once: {got.shape[0]} planned, "
                             f"{want.shape[0]} pieces")
