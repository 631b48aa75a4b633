"""skip_nonfinite without a guard: the step's verdict, taken once from every replica's loss and the
summed gradients, skips the update on every replica.

Two replicas of one sample each; the bad value sits on replica 1 only. A NaN feature makes its
gradients NaN; in the "sum" case both replicas' gradients are finite (2e38) and only their sum
(4e38) is beyond float32, an update that would turn the weights infinite.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", ["nan", "sum"])
def test_a_bad_value_on_one_replica_skips_the_update_on_both(run_worker, case):
    found = run_worker({"mode": "verdict", "replicas": 2, "case": case, "skip": True})
    assert int(found["skipped_steps"]) == 1 and int(found["iterations"]) == 0
    for i in range(sum(k.startswith("before") for k in found)):
        np.testing.assert_array_equal(found[f"after{i}"], found[f"before{i}"])


def test_without_skip_nonfinite_the_update_is_applied_and_the_step_still_counted(run_worker):
    found = run_worker({"mode": "verdict", "replicas": 2, "case": "nan", "skip": False})
    assert int(found["skipped_steps"]) == 0 and int(found["iterations"]) == 1
    assert not all(np.isfinite(found[f"after{i}"]).all() for i in range(sum(k.startswith("after") for k in found)))
