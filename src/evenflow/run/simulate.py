"""Emulated slow devices, for testing and demonstrating rebalancing.

``--simulate-slow 3:2`` makes replica 3 take twice as long per sample; ``3:2@100``
from global step 100 on (steps counted over the run: ``epoch * steps_per_epoch +
step``). The slowdown is a delay inside that replica's step, after its gradients
are computed: ``(FACTOR - 1) x`` the time its computation took, so proportional to
its real batch. The trainer is never told the factor; it has to measure it.

``sample_ms`` gives every replica an emulated device time per real sample: its step
lasts ``FACTOR x max(compute, sample_ms x real samples)`` from its start, the real
computation running inside that time. On a machine whose replicas share a few CPU cores
(logical devices), it makes replicas behave like separate devices that work at the same
time: the delays are sleeps, during which the other replicas run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from evenflow.util.validate import check_int, check_number

_ITEM = re.compile(r"^\s*(\d+)\s*:\s*([0-9.eE+-]+)\s*(?:@\s*(\d+))?\s*$")


@dataclass(frozen=True)
class SlowReplica:
    """Replica ``replica`` takes ``factor`` times as long per sample from global step ``from_step`` on."""

    replica: int
    factor: float
    from_step: int = 0

    def __post_init__(self):
        object.__setattr__(self, "replica", check_int("simulate_slow: the replica", self.replica, 0))
        object.__setattr__(self, "factor", check_number("simulate_slow: the factor", self.factor, 1, 100,
                                                        fix="2 = twice as slow"))
        object.__setattr__(self, "from_step", check_int("simulate_slow: the step", self.from_step, 0))


@dataclass(frozen=True)
class Simulation:
    """Slow replicas and an emulated per-sample device time (milliseconds, >= 0)."""

    slow: tuple[SlowReplica, ...] = ()
    sample_ms: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "sample_ms", check_number("simulate_sample_ms", self.sample_ms, 0))
        if not isinstance(self.slow, (tuple, list)) or not all(isinstance(s, SlowReplica) for s in self.slow):
            raise TypeError(f"slow must be a tuple of SlowReplica (e.g. (SlowReplica(1, 2.0),), or "
                            f"parse_slow('1:2') for the command line's form), got {self.slow!r}")
        replicas = [s.replica for s in self.slow]
        if len(set(replicas)) != len(replicas):
            twice = sorted({r for r in replicas if replicas.count(r) > 1})
            raise ValueError(f"slow names replica(s) {twice} more than once; give each replica one SlowReplica")
        object.__setattr__(self, "slow", tuple(self.slow))

    @property
    def active(self) -> bool:
        return bool(self.slow) or self.sample_ms > 0

    def check(self, replicas: int) -> None:
        """Every slowed replica must exist."""
        for s in self.slow:
            if s.replica >= replicas:
                raise ValueError(f"simulate_slow: replica {s.replica} does not exist in a run of {replicas} "
                                 f"replicas; use a replica in [0, {replicas - 1}]")


def parse_slow(text: str) -> tuple[SlowReplica, ...]:
    """``"3:2"``, ``"3:2@100"``, ``"1:1.5,3:3@50"`` -> slow replicas ("" -> none)."""
    if not isinstance(text, str):
        raise TypeError(f"simulate_slow must be a string like '3:2@100', got {type(text).__name__}")
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        m = _ITEM.match(item)
        if m is None:
            raise ValueError(f"simulate_slow must be REPLICA:FACTOR[@STEP] items separated by commas, e.g. 3:2 or "
                             f"3:2@100, got {item!r}")
        try:
            factor = float(m.group(2))
        except ValueError:
            raise ValueError(f"simulate_slow: {m.group(2)!r} in {item!r} is not a number; e.g. 3:2") from None
        out.append(SlowReplica(int(m.group(1)), factor, int(m.group(3) or 0)))
    return tuple(out)
