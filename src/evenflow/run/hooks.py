"""What a training loop calls back into: the caller's functions, the training guard and the speed monitor."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Hooks:
    """``on_step(cursor, sums)``, ``on_epoch(result)`` and ``on_batch(cursor, batch)`` (each optional),
    the :class:`~evenflow.run.guard.TrainingGuard` and the :class:`~evenflow.run.monitor.ReplicaMonitor` (or None)."""

    on_step: Callable | None
    on_epoch: Callable | None
    on_batch: Callable | None
    guard: object
    monitor: object

    def __post_init__(self):
        for name in ("on_step", "on_epoch", "on_batch"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                # Refused before the first step, not when the first step calls it.
                raise TypeError(f"{name} must be a function or None, got {type(fn).__name__}")
