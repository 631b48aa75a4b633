"""The masked loss and the world-size invariant plan together: 1, 2 or 4 replicas train identically.

Same seed, same global batch size, same data: after several SGD steps the weights
must agree to float32 rounding whatever the number of replicas, even though the
global batch (30) does not divide by 4 and the dataset (203) does not divide by the
global batch, so most steps carry padding. Each replica count runs in its own
process (logical devices are fixed when TensorFlow starts).
"""
from __future__ import annotations

import numpy as np
import pytest

BASE = {"mode": "train", "record": False, "n": 203, "classes": 5, "batch": 30, "epochs": 2, "seed": 3,
        "optimizer": "sgd", "lr": 0.2, "features": [6]}

pytestmark = pytest.mark.slow


def _weights(found: dict) -> list[np.ndarray]:
    return [found[k] for k in sorted((k for k in found if k.startswith("w")), key=lambda k: int(k[1:]))]


def test_one_two_four_replicas_give_the_same_weights(run_worker):
    runs = {r: run_worker(dict(BASE, replicas=r)) for r in (1, 2, 4)}
    reference = _weights(runs[1])
    # The initial weights must be identical too, or the comparison below would be meaningless.
    for r in (2, 4):
        for k in (k for k in runs[1] if k.startswith("init")):
            np.testing.assert_array_equal(runs[r][k], runs[1][k])
    moved = max(float(np.abs(w - runs[1][f"init{i}"]).max()) for i, w in enumerate(reference))
    assert moved > 1e-2  # training really changed the weights
    for r in (2, 4):
        for i, (w, ref) in enumerate(zip(_weights(runs[r]), reference)):
            np.testing.assert_allclose(w, ref, rtol=2e-5, atol=2e-6,
                                       err_msg=f"weight {i} differs between 1 and {r} replicas")
        # The per-epoch mean loss is a mean over the same samples with the same weights, too.
        np.testing.assert_allclose(runs[r]["losses"], runs[1]["losses"], rtol=1e-5)
        assert runs[r]["epoch_samples"].tolist() == [203, 203]


def test_optimizer_sums_replica_gradients_into_the_mean_over_real_samples(run_worker):
    # One plain-SGD step on 4 replicas with 29 real samples in a 32-slot step: the update must be
    # exactly -lr * grad(mean loss over the 29 samples). If Keras averaged the replica gradients
    # instead of summing them, the update would be 4x too small; if the loss were divided by the
    # padded batch size, it would be 29/32 of the right size.
    found = run_worker({"mode": "onestep", "replicas": 4, "n": 29, "classes": 3, "batch": 32, "seed": 1,
                        "optimizer": "sgd", "lr": 1.0, "features": [5]})
    assert int(found["real"]) == 29
    for i in range(sum(k.startswith("delta") for k in found)):
        np.testing.assert_allclose(found[f"delta{i}"], -found[f"grad{i}"], rtol=1e-4, atol=1e-6)
