"""The reading position of a loader or sampler as a ``state_dict``, restorable on any number of ranks.

A plan's only state is its :class:`~evenflow.plan.cursor.Cursor` (epoch, global steps done), and
global steps do not depend on the number of ranks (the plan's world-size invariance): a position
saved on R ranks resumes on R' ranks, which read exactly the epoch's remaining samples, each once
(:meth:`evenflow.Plan.epoch` with ``start=``). The state is the torchdata ``StatefulDataLoader``
protocol's plain dict, which Lightning, Accelerate and ``torch.distributed.checkpoint`` save with
the model::

    {"epoch": 2, "step": 17, "plan": "<plan fingerprint>", "replicas": 4}

``plan`` is :meth:`evenflow.Plan.fingerprint` (index, global batch size, seed and options, not the
topology): a state restores only into a reader of the same plan. ``replicas`` is the world size
it was saved on, for the reader's information. A position at an epoch's end is the next epoch's
start.
"""
from __future__ import annotations

from evenflow.plan import Cursor, Plan

STATE_KEYS = ("epoch", "step", "plan", "replicas")


def position_state(plan: Plan, epoch: int, step: int) -> dict:
    """The state of a reader of ``plan`` whose next global step is ``step`` of ``epoch``."""
    if step >= plan.num_steps:
        epoch, step = epoch + 1, 0
    return {"epoch": int(epoch), "step": int(step), "plan": plan.fingerprint(), "replicas": plan.topology.replicas}


def restored_cursor(plan: Plan, state, who: str) -> Cursor:
    """The cursor ``state`` (from :func:`position_state`) resumes at, for a reader of ``plan``; checked.

    Raises:
        TypeError: ``state`` is not a dict.
        ValueError: a key is missing, the state is another plan's, or its step is past the epoch.
    """
    if not isinstance(state, dict):
        raise TypeError(f"{who}.load_state_dict takes the dict its state_dict() returned, got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"{who}.load_state_dict: the state has no {', '.join(missing)}; pass the dict "
                         f"{who}.state_dict() returned (keys {', '.join(STATE_KEYS)})")
    if state["plan"] != plan.fingerprint():
        raise ValueError(f"{who}.load_state_dict: the state was saved reading plan {state['plan']!r}, but this "
                         f"{who} reads plan {plan.fingerprint()!r}; build the same Plan (dataset, global batch size, "
                         f"seed, options; any number of ranks) to resume")
    cursor = Cursor(int(state["epoch"]), int(state["step"]))
    if cursor.step > plan.num_steps:
        raise ValueError(f"{who}.load_state_dict: step {cursor.step} is past the epoch's {plan.num_steps} steps")
    return cursor
