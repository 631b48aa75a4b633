"""Who trains: the number of replicas and how fast each one is relative to the others.

A :class:`Topology` is a value built from numbers. It does not look at devices or
environment variables; detecting the topology of a running job is the job of the
framework adapters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evenflow.util.validate import check_int


@dataclass(frozen=True)
class Topology:
    """Replicas and their relative speeds.

    Args:
        replicas: number of data-parallel replicas, at least 1.
        weights: optional relative speed per replica (any positive scale),
            length ``replicas``. A replica with weight 0.5 gets half the work of
            one with weight 1. Default: all equal.
    """

    replicas: int
    weights: tuple[float, ...] | None = None

    def __post_init__(self):
        r = check_int("replicas", self.replicas, 1)
        object.__setattr__(self, "replicas", r)
        if self.weights is None:
            return
        try:
            w = tuple(float(x) for x in self.weights)
        except (TypeError, ValueError) as e:
            raise TypeError(f"weights must be a sequence of numbers, got {self.weights!r}") from e
        if len(w) != r:
            raise ValueError(
                f"weights must have one entry per replica: replicas is {r} but {len(w)} weights were "
                f"given ({', '.join(f'{x:g}' for x in w)}); pass {r} weights")
        for i, x in enumerate(w):
            if not math.isfinite(x) or x <= 0:
                raise ValueError(
                    f"every weight must be a finite number > 0, but weight {i} is {x:g}; "
                    f"give slow replicas a small positive weight or remove them from the topology")
        object.__setattr__(self, "weights", w)

    @property
    def shares(self) -> np.ndarray:
        """Fraction of the work per replica, shape ``[replicas]`` float64, summing to 1."""
        if self.weights is None:
            return np.full(self.replicas, 1.0 / self.replicas)
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()

    @property
    def is_uniform(self) -> bool:
        """True when every replica has the same weight."""
        return self.weights is None or len(set(self.weights)) == 1
