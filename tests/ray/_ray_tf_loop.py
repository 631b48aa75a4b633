"""The TensorFlow side of the Ray tests: a TensorFlow loop's training function (importable by Ray's worker processes
as tests.ray...) and the flags of the ``evenflow train --engine ray --framework tf`` run (tests/test_doc_blocks.py
checks the docs' TensorFlow engine commands against this file)."""
from __future__ import annotations

import os


def tf_position_loop(cfg: dict) -> None:
    """A TensorFlow worker's loop: its own cursor in Ray's checkpoint (no TensorFlow needed to save a position)."""
    import evenflow.ray

    assert evenflow.ray.restored_position() is None  # a fresh start: Ray hands no checkpoint
    assert '"worker"' in os.environ["TF_CONFIG"]      # Ray's TensorflowTrainer set it
    evenflow.ray.report_checkpoint({"loss": 0.5}, None, position={"epoch": 1, "step": 3})


def tf_cli_args(address: str) -> list[str]:
    """``evenflow train`` flags of the TensorFlow engine run on the Ray cluster at ``address``: builtin:digits
    (1,797 samples, 15 steps of 128 in its one epoch), 64 samples x 4 ms per replica and step, a checkpoint every
    3 steps (the driver kills a worker after the one at step 3)."""
    return ["--engine", "ray", "--workers", "2", "--address", address, "--framework", "tf", "--dataset",
            "builtin:digits", "--epochs", "1", "--global-batch-size", "128", "--test-fraction", "0",
            "--checkpoint-every", "3", "--simulate-sample-ms", "4", "--collective-timeout", "20", "--audit"]
