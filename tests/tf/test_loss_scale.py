"""mixed_float16: a float16 overflow on one replica skips the step on every replica.

Keras's LossScaleOptimizer decides from replica 0's local gradients whether to skip a
step; the trainer first makes all replicas agree. Here only replica 1's samples
overflow: the weights must stay as they were (not become NaN) and the loss scale
must halve.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_overflow_on_one_replica_skips_the_step_everywhere(run_worker):
    found = run_worker({"mode": "overflow", "replicas": 2})
    assert float(found["scale_after"]) == float(found["scale_before"]) / 2
    for i in range(sum(k.startswith("before") for k in found)):
        np.testing.assert_array_equal(found[f"after{i}"], found[f"before{i}"])
