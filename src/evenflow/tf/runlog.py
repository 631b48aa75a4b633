"""What a run leaves in its directory: TensorBoard events and ``summary.json``.

TensorBoard gets, per epoch: train loss and accuracy, samples/s, and each
replica's real and padding sample counts (from the plan, so a lopsided split
shows up as diverging lines); at the end, the test loss and accuracy.
``summary.json`` holds the final figures and the plan's balance summary as
plain JSON.

Scalars are written with the core op ``tf.summary.write`` and the metadata of
TensorBoard's scalars plugin, rather than ``tf.summary.scalar``: the latter lives
in the ``tensorboard`` package, which ``tensorflow-cpu`` does not install. The
files read the same in TensorBoard.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from evenflow.tf._lazy import tf as _tf

__all__ = ["RunLog", "write_json", "TENSORBOARD_DIR"]

TENSORBOARD_DIR = "tensorboard"


def _plain(value):
    """numpy scalars and arrays to JSON types; non-finite floats to None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def write_json(path: str | Path, data: dict) -> None:
    """Write ``data`` as indented JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_plain(data), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _scalar_metadata():
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)


class RunLog:
    """TensorBoard writer of one run, under ``<run_dir>/tensorboard``.

    Event files of an earlier run in the same directory are removed first, so
    TensorBoard does not draw two runs on top of each other — unless
    ``keep_events`` (a resumed run continues the same curves).
    """

    def __init__(self, run_dir: str | Path, keep_events: bool = False):
        tf = _tf()
        self.dir = Path(run_dir) / TENSORBOARD_DIR
        if self.dir.is_dir() and not keep_events:
            for old in self.dir.glob("events.out.tfevents.*"):
                old.unlink()
        self._writer = tf.summary.create_file_writer(str(self.dir))
        self._meta = _scalar_metadata()

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Write one float32 scalar, as TensorBoard's scalars plugin stores it."""
        tf = _tf()
        with self._writer.as_default():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=self._meta)

    def epoch(self, step: int, result, real_counts: np.ndarray, padding: np.ndarray) -> None:
        """Log one epoch at global step ``step``.

        Args:
            step: global steps done so far (the x axis).
            result: an :class:`~evenflow.tf.trainer.EpochResult`.
            real_counts: int ``[replicas]`` real samples per replica in the epoch.
            padding: int ``[replicas]`` padding slots per replica in the epoch.
        """
        self.scalar("train/loss", result.loss, step)
        self.scalar("train/accuracy", result.accuracy, step)
        self.scalar("train/samples_per_second", result.samples_per_second, step)
        for r, (real, pad) in enumerate(zip(real_counts, padding)):
            self.scalar(f"replica_real_samples/replica_{r}", real, step)
            self.scalar(f"replica_padding/replica_{r}", pad, step)

    def test(self, step: int, result) -> None:
        """Log an :class:`~evenflow.tf.trainer.EvalResult` at global step ``step``."""
        self.scalar("test/loss", result.loss, step)
        self.scalar("test/accuracy", result.accuracy, step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
