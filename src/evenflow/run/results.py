"""What a training run reports: per-epoch results, exact evaluation results, and the running epoch tally.

Both frameworks' trainers return these types: they come from the framework-neutral loop
(:mod:`evenflow.run.loop`), which sums the per-replica ``[loss sum, hits, real count]``
rows every step produces.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpochResult:
    """What one epoch of training did.

    Attributes:
        epoch: epoch number.
        steps: global steps run.
        samples: real samples trained on, counted from the masks of the batches consumed.
        loss: mean loss over those samples (each computed before its step's update).
        accuracy: fraction of them classified correctly (before each step's update).
        seconds: wall time of the epoch's steps, first step's start to last step's end
            (summed over the processes that ran parts of it, after a resume).
        replica_samples: real samples each replica trained on, from its masks (after an
            elastic resume mid-epoch: only those of the current replicas, since the resume).
        skipped_steps: steps whose update was skipped as non-finite (their samples are not
            counted in ``samples``, ``loss`` and ``accuracy``).
    """

    epoch: int
    steps: int
    samples: int
    loss: float
    accuracy: float
    seconds: float
    replica_samples: tuple[int, ...] = ()
    skipped_steps: int = 0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class EvalResult:
    """Exact metrics over an evaluation plan: ``count`` is the number of samples seen."""

    count: int
    loss: float
    accuracy: float

    @classmethod
    def from_sums(cls, totals) -> "EvalResult":
        """From summed ``[loss sum, hits, real count]``."""
        loss_sum, hits, n = (float(v) for v in totals)
        n = int(round(n))
        return cls(count=n, loss=loss_sum / max(n, 1), accuracy=hits / max(n, 1))


class Tally:
    """Running totals of one epoch's applied steps; saved in checkpoints to finish the epoch's figures.

    ``sums`` is float64 ``[local replicas, 3]`` (loss sum, hits, real count) of this
    process; ``base`` holds totals carried over from a checkpoint. A checkpoint stores
    the sums of *all* replicas (``to_dict(all_sums)``); a single process with the same
    replicas takes them back per replica, otherwise (other replicas, or several
    processes, each of which must not count them again) they become ``base``.
    """

    def __init__(self, replicas: int, partial: dict | None = None, per_replica: bool = True):
        self.sums = np.zeros((replicas, 3))
        self.base = np.zeros(3)
        self.gathered = None  # (steps, sums of all processes' replicas) once all-gathered
        self.steps = self.skipped = 0
        self._seconds = 0.0
        self._began = time.perf_counter()
        if partial:
            sums = np.asarray(partial["sums"], dtype=np.float64).reshape(-1, 3)
            if per_replica and sums.shape == self.sums.shape:
                self.sums += sums
            else:
                self.base += sums.sum(axis=0)
            self.base += np.asarray(partial.get("base", np.zeros(3)), dtype=np.float64)
            self.steps, self.skipped = int(partial["steps"]), int(partial["skipped"])
            self._seconds = float(partial["seconds"])

    def add(self, row: dict) -> None:
        """Count one settled step (``sums`` ``[local R, 3]``, ``flags`` ``[local R, 3]``)."""
        self.steps += 1
        if row["flags"][:, 2].max() > 0:  # skipped: nothing was trained
            self.skipped += 1
        else:
            self.sums += row["sums"]

    def seconds(self) -> float:
        return self._seconds + time.perf_counter() - self._began

    def to_dict(self, all_sums: np.ndarray | None = None) -> dict:
        """JSON form; ``all_sums`` are the sums of every process's replicas (default this process's)."""
        sums = self.sums if all_sums is None else np.asarray(all_sums)
        return {"sums": sums.tolist(), "base": self.base.tolist(), "steps": self.steps,
                "skipped": self.skipped, "seconds": self.seconds()}

    def result(self, epoch: int, all_sums: np.ndarray) -> EpochResult:
        """The :class:`EpochResult` of this tally, given every replica's sums ``[R, 3]``."""
        totals = np.asarray(all_sums).sum(axis=0) + self.base
        loss_sum, hits, n = totals
        n = int(round(n))
        return EpochResult(epoch=epoch, steps=self.steps, samples=n, loss=float(loss_sum) / max(n, 1),
                           accuracy=float(hits) / max(n, 1), seconds=self.seconds(),
                           replica_samples=tuple(int(round(c)) for c in np.asarray(all_sums)[:, 2]),
                           skipped_steps=self.skipped)
