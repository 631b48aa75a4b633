"""Runs ``evenflow.tf.fit`` with a run directory on step buffers of 3 steps; prints what it checked (see
test_keras_step_buffer.py)."""
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import evenflow.tf  # noqa: E402
from evenflow.tf.keras import run as keras_run, step_buffer  # noqa: E402


def main(run: Path) -> None:
    import keras

    step_buffer.BUFFER_IDS = 3 * 30  # rows of a global batch of 30: 3 steps per buffer
    keras_run.READ_SECONDS = 1e9  # read back for steps only (tracing the first step takes seconds)
    reads = []
    drain = step_buffer.StepBuffer.drain

    def counted(self):
        out = drain(self)
        reads.append(len(out))
        return out

    step_buffer.StepBuffer.drain = counted
    strategy = evenflow.tf.mirrored_strategy(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(203, 5)).astype(np.float32), rng.integers(0, 3, 203)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    evenflow.tf.fit(model, x, y, batch_size=30, epochs=2, verbose=0, output_dir=run, audit=True,
                    checkpoint_every=4, keep_checkpoints=10)
    recorder = model._evenflow_exact.recorder
    print(json.dumps({"buffer": type(recorder).__name__, "capacity": recorder.capacity, "reads": reads}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
