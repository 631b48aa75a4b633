"""What a run leaves in its directory besides checkpoints: TensorBoard events.

TensorBoard gets, per epoch: train loss and accuracy, samples/s, and each replica's real and
padding sample counts (from the plan, so a lopsided split shows up as diverging lines); at
the end, the test loss and accuracy; and the monitor's per-replica telemetry
(:mod:`evenflow.run.monitor`). The event files are written by the framework adapter's
:class:`ScalarWriter` (TensorFlow's ``tf.summary``, PyTorch's ``torch.utils.tensorboard``);
both read the same in TensorBoard.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

TENSORBOARD_DIR = "tensorboard"


class ScalarWriter(Protocol):
    """A TensorBoard writer of float scalars (a framework adapter makes one for a directory)."""

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Write one float32 scalar at global step ``step``."""

    def close(self) -> None:
        """Flush and close the event file."""


def clear_events(run_dir: str | Path) -> Path:
    """The run's TensorBoard directory, emptied of earlier event files (a fresh run's curves start clean)."""
    path = Path(run_dir) / TENSORBOARD_DIR
    if path.is_dir():
        for old in path.glob("events.out.tfevents.*"):
            old.unlink()
    return path


class RunLog:
    """The TensorBoard log of one run, through a framework's :class:`ScalarWriter`.

    Args:
        writer: the :class:`ScalarWriter` of ``dir``.
        dir: where the event files are (for messages).
    """

    def __init__(self, writer: ScalarWriter, dir: Path):
        self.writer, self.dir = writer, Path(dir)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.scalar(tag, float(value), int(step))

    def epoch(self, step: int, result, real_counts: np.ndarray, padding: np.ndarray) -> None:
        """Log one :class:`~evenflow.run.results.EpochResult` at global step ``step``.

        ``real_counts`` and ``padding``: int ``[replicas]`` real samples and padding slots per replica.
        """
        self.scalar("train/loss", result.loss, step)
        self.scalar("train/accuracy", result.accuracy, step)
        self.scalar("train/samples_per_second", result.samples_per_second, step)
        for r, (real, pad) in enumerate(zip(real_counts, padding)):
            self.scalar(f"replica_real_samples/replica_{r}", real, step)
            self.scalar(f"replica_padding/replica_{r}", pad, step)

    def test(self, step: int, result) -> None:
        """Log an :class:`~evenflow.run.results.EvalResult` at global step ``step``."""
        self.scalar("test/loss", result.loss, step)
        self.scalar("test/accuracy", result.accuracy, step)

    def close(self) -> None:
        self.writer.close()


class NoLog:
    """:class:`RunLog`'s interface, writing nothing: the log of a process that is not the chief."""

    dir = None

    def scalar(self, *args) -> None:
        pass

    def epoch(self, *args) -> None:
        pass

    def test(self, *args) -> None:
        pass

    def close(self) -> None:
        pass
