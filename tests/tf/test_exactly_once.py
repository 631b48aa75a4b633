"""Every sample is trained on exactly once per epoch and evaluated exactly once, from the batches consumed.

The ids are read back from the distributed batches each replica actually received,
not from the plan, so the test covers reader, distribution and loop together.
Edge cases, one row each:
  * N = 203, G = 30, R = 4: N not divisible by G (last step 23 real of 32 slots);
    G not divisible by R (slots 8, some replicas 7 real per step);
  * N = 5, G = 16, R = 4: fewer samples than one global batch (one step; a replica gets 1-2);
  * N = 3, G = 8, R = 4: fewer samples than replicas, so one replica's batch is all padding.
"""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef

pytestmark = pytest.mark.slow

CASES = [  # (n, batch, eval_n)
    (203, 30, 61),
    (5, 16, 7),
    (3, 8, 2),
]


def _check_epochs(seen: np.ndarray, cursors: np.ndarray, n: int, plan: ef.Plan, epochs, first_step=0):
    """seen: [steps, R, slots] ids consumed; cursors: [steps, 2] (epoch, step after)."""
    row = 0
    for e in epochs:
        start = ef.Cursor(e, first_step) if e == epochs[0] and first_step else None
        ep = plan.epoch(e, start=start)
        got = seen[row:row + ep.num_steps]
        # Replica r received exactly its row of the plan, slot for slot, -1 where padded.
        np.testing.assert_array_equal(got, ep.ids)
        assert cursors[row:row + ep.num_steps].tolist() == [[e, ep.start_step + s + 1] for s in range(ep.num_steps)]
        if start is None:
            real = got[got >= 0]
            assert np.array_equal(np.sort(real), np.arange(n)), f"epoch {e} did not see each of the {n} ids once"
        row += ep.num_steps
    assert row == len(seen), "the loop consumed more batches than the plan has steps"


@pytest.mark.parametrize("n,batch,eval_n", CASES)
def test_every_sample_once_per_epoch_and_every_test_sample_once(run_worker, n, batch, eval_n):
    found = run_worker({"mode": "train", "replicas": 4, "n": n, "classes": 3, "batch": batch, "epochs": 2,
                        "seed": 5, "optimizer": "adam", "lr": 0.01, "features": [4], "eval_n": eval_n,
                        "resume": [1, 1] if n > batch else None})
    plan = ef.Plan(ef.Index(n), ef.Topology(4), global_batch_size=batch, seed=5)
    assert int(found["slots"]) == plan.slots
    _check_epochs(found["seen"], found["cursors"], n, plan, [0, 1])
    # Counts measured from the masks: every sample once; per replica, what the plan gave it.
    assert found["epoch_samples"].tolist() == [n, n]
    for e in (0, 1):
        assert found["replica_samples"][e].tolist() == plan.epoch(e).real_counts.sum(axis=0).tolist()
    # Two evaluations in a row each count every test sample exactly once.
    assert found["eval_counts"].tolist() == [eval_n, eval_n]
    assert found["eval_accuracy"][0] == found["eval_accuracy"][1]
    assert np.all(np.isfinite(found["losses"]))
    if n > batch:
        # Resuming from Cursor(1, 1) runs the rest of epoch 1, then all of epoch 2.
        _check_epochs(found["resume_seen"], found["resume_cursors"], n, plan, [1, 2], first_step=1)
