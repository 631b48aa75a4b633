"""A position in training: an epoch and the number of global steps done in it.

The cursor is the plan's only state. A checkpoint that stores the cursor can
recompute everything that remains, for the same or for a different topology.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Cursor"]


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
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"Cursor.{name} must be an int, got {type(v).__name__} ({v!r})")
            if v < 0:
                raise ValueError(f"Cursor.{name} must be >= 0, got {v}")
            object.__setattr__(self, name, int(v))

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step}

    @classmethod
    def from_dict(cls, d: dict) -> "Cursor":
        return cls(epoch=int(d["epoch"]), step=int(d["step"]))
