"""The training function of a Ray test's TensorFlow workers (importable by Ray's worker processes as tests.ray...)."""
from __future__ import annotations

import os


def tf_position_loop(cfg: dict) -> None:
    """A TensorFlow worker's loop: its own cursor in Ray's checkpoint (no TensorFlow needed to save a position)."""
    import evenflow.ray

    assert evenflow.ray.restored_position() is None  # a fresh start: Ray hands no checkpoint
    assert '"worker"' in os.environ["TF_CONFIG"]      # Ray's TensorflowTrainer set it
    evenflow.ray.report_checkpoint({"loss": 0.5}, None, position={"epoch": 1, "step": 3})
