"""A position in training: an epoch and the number of global steps done in it.

The cursor is the plan's only state. A checkpoint that stores the cursor can
recompute everything that remains, for the same or for a different topology.
"""
from __future__ import annotations

from dataclasses import dataclass

from evenflow.util.validate import check_int


@dataclass(frozen=True, order=True)
class Cursor:
    """Epoch ``epoch``, with global steps ``0..step-1`` of it already trained.

    Args:
        epoch: epoch number, >= 0.
        step: global steps completed in that epoch, >= 0.
    """

    epoch: int = 0
    step: int = 0

    def __post_init__(self):
        for name in ("epoch", "step"):
            object.__setattr__(self, name, check_int(f"Cursor.{name}", getattr(self, name), 0))

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step}

    @classmethod
    def from_dict(cls, d: dict) -> "Cursor":
        return cls(epoch=int(d["epoch"]), step=int(d["step"]))


def window_steps(epoch, start: "Cursor | None", stop: "Cursor | None", num_steps: int) -> tuple[int, int]:
    """Steps ``(first, last)`` of ``epoch`` from the cursors ``start``..``stop`` (None: the epoch's ends), checked."""
    check_int("epoch", epoch, 0)
    bound = []
    for name, cursor, default in (("start", start, 0), ("stop", stop, num_steps)):
        if cursor is None:
            bound.append(default)
            continue
        if not isinstance(cursor, Cursor):
            raise TypeError(f"{name} must be an evenflow Cursor, got {type(cursor).__name__}")
        if cursor.epoch != epoch:
            raise ValueError(f"the {name} cursor is in epoch {cursor.epoch} but epoch {epoch} was asked for; "
                             f"pass epoch={cursor.epoch} or a cursor in epoch {epoch}")
        if cursor.step > num_steps:
            raise ValueError(f"the {name} cursor must be within the epoch's {num_steps} steps, "
                             f"got step {cursor.step}; the last valid cursor is Cursor({epoch}, {num_steps})")
        bound.append(cursor.step)
    if bound[1] < bound[0]:
        raise ValueError(f"the stop cursor (step {bound[1]}) is before the start cursor (step {bound[0]}); "
                         f"pass a stop at or after the start")
    return bound[0], bound[1]
