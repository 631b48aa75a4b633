"""TensorBoard scalars written with TensorFlow's own summary op.

Scalars are written with the core op ``tf.summary.write`` and the metadata of TensorBoard's
scalars plugin, rather than ``tf.summary.scalar``: the latter lives in the ``tensorboard``
package, which ``tensorflow-cpu`` does not install. The files read the same in TensorBoard.
"""
from __future__ import annotations

from pathlib import Path

from evenflow.tf._lazy import tf as _tf


def _scalar_metadata():
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)


class TFScalarWriter:
    """A :class:`evenflow.run.runlog.ScalarWriter` into event files under ``directory``."""

    def __init__(self, directory: str | Path):
        tf = _tf()
        self._writer = tf.summary.create_file_writer(str(directory))
        self._meta = _scalar_metadata()

    def scalar(self, tag: str, value: float, step: int) -> None:
        tf = _tf()
        with self._writer.as_default():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=self._meta)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
