"""``model.fit`` on ``keras_dataset`` + ``keras_loss`` applies exactly the custom trainer's updates.

2 replicas, 2 epochs of 203 samples with a global batch of 30 (15 slots per replica;
the last step of each epoch has 23 real samples in 30 slots): the weights after
``fit`` equal the Trainer's. The control run — Keras's default ``sum_over_batch_size`` loss with mask weights —
must differ, which shows the comparison can detect the padding bias.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_keras_fit_matches_the_trainer_and_the_naive_loss_does_not(run_worker):
    found = run_worker({"mode": "keras", "replicas": 2, "n": 203, "classes": 4, "batch": 30, "epochs": 2,
                        "seed": 4, "optimizer": "sgd", "lr": 0.3, "features": [6], "eval_n": 61}, timeout=180)
    layers = sorted(int(k[len("trainer"):]) for k in found if k.startswith("trainer") and k[7:].isdigit())
    for i in layers:
        np.testing.assert_allclose(found[f"fit{i}"], found[f"trainer{i}"], rtol=2e-5, atol=2e-6,
                                   err_msg=f"model.fit weight {i} differs from the Trainer's")
    # model.evaluate on mask-weighted test batches (61 samples, padded steps) gives the exact accuracy.
    assert int(found["eval_count"]) == 61
    assert float(found["fit_accuracy"]) == pytest.approx(float(found["trainer_accuracy"]), abs=1e-6)
    gap = max(float(np.abs(found[f"naive{i}"] - found[f"trainer{i}"]).max()) for i in layers)
    assert gap > 1e-3, "the default Keras reduction should be visibly off on padded steps"
