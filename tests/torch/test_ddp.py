"""DDP under real gloo process groups on 127.0.0.1: 1, 2 and 3 ranks on uneven data, a killed rank, a resume.

One module-scoped set of runs feeds several checks: N = 203 samples and a global batch
of 30 (7 steps, the last one of 23 samples; 30 does not divide by 3 ranks or 2 ranks
with weights 1:2), two epochs of SGD with momentum, sample 57 poisoned with NaN
features, and in the 2-rank run a rebalance to weights (1, 2) decided after step 3 of epoch 0.
Each rank records the ids it trained on at every step (the audit).
"""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef

pytestmark = pytest.mark.slow

SPEC = {"n": 203, "classes": 5, "batch": 30, "epochs": 2, "seed": 3, "lr": 0.1, "momentum": 0.9,
        "features": [6], "eval_n": 31, "nan_ids": [57], "pg_timeout": 20}
REBALANCE = [0, 3, [1.0, 2.0]]


@pytest.fixture(scope="module")
def runs(warm_workers):
    # The three runs at once (6 processes), each rank forked from a process that has imported PyTorch
    # (tests/_warm.py): importing it would be most of their time.
    worlds = (1, 2, 3)
    groups = warm_workers([(dict(SPEC, rebalance=REBALANCE if w == 2 else None), w, f"w{w}") for w in worlds])
    out = {}
    for world, ranks in zip(worlds, groups):
        for r, run in enumerate(ranks):
            assert run.returncode == 0, f"rank {r} of {world} failed:\n{run.stderr[-3000:]}"
        out[world] = [run.found for run in ranks]
    return out


def _plan() -> ef.Plan:
    return ef.Plan(ef.Index(SPEC["n"]), ef.Topology(1), global_batch_size=SPEC["batch"], seed=SPEC["seed"])


def _weights(found: dict) -> list[np.ndarray]:
    return [found[k] for k in sorted((k for k in found if k.startswith("w")), key=lambda k: int(k[1:]))]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_runs_every_step_and_every_sample_is_trained_once(runs, world):
    plan = _plan()
    ranks = runs[world]
    expected = [(e, s + 1) for e in range(SPEC["epochs"]) for s in range(plan.num_steps)]
    for found in ranks:  # equal steps: nobody stopped early on the uneven last step
        assert [tuple(c) for c in found["cursors"]] == expected
    for e in range(SPEC["epochs"]):
        ref = plan.epoch(e)
        epoch_ids = []
        for s in range(plan.num_steps):
            k = e * plan.num_steps + s
            step_ids = np.concatenate([f["seen"][k][f["seen"][k] >= 0] for f in ranks])
            # World-size invariance: the step's global set is the plan's, whoever got which sample.
            np.testing.assert_array_equal(np.sort(step_ids), ref.step_ids(s))
            epoch_ids.append(step_ids)
        epoch_ids = np.concatenate(epoch_ids)
        assert len(epoch_ids) == SPEC["n"]
        np.testing.assert_array_equal(np.sort(epoch_ids), np.arange(SPEC["n"]))


def test_rebalanced_rank_gets_twice_the_samples_after_the_hook(runs):
    r0, r1 = runs[2]
    plan = _plan()
    for k in range(2 * plan.num_steps):
        n0, n1 = int((r0["seen"][k] >= 0).sum()), int((r1["seen"][k] >= 0).sum())
        # Decided after step 3, in effect from the first step the sampler has not read: with no loader
        # workers it reads no step ahead, so from step 3 itself.
        if k < REBALANCE[1]:
            assert abs(n0 - n1) <= 1, (k, n0, n1)         # equal weights before the switch
        else:
            total = n0 + n1                                  # weights 1:2 from Cursor(0, 3) on, later epochs too
            assert abs(n1 - 2 * total / 3) < 1, (k, n0, n1)


def test_nan_step_is_skipped_on_every_rank_and_ranks_stay_identical(runs):
    plan = _plan()
    poisoned = sorted((e, s) for e in range(SPEC["epochs"]) for s in range(plan.num_steps)
                      if 57 in plan.epoch(e).step_ids(s))
    for world, ranks in runs.items():
        for found in ranks:
            assert [tuple(x) for x in found["skipped"]] == poisoned, world
            # The skipped steps' samples are not counted as trained.
            skipped_real = [len(plan.epoch(e).step_ids(s)) for e, s in poisoned]
            assert found["epoch_samples"].sum() == SPEC["epochs"] * SPEC["n"] - sum(skipped_real)
            assert all(np.isfinite(w).all() for w in _weights(found))
        for found in ranks[1:]:  # DDP kept the replicas bitwise in sync
            for a, b in zip(_weights(found), _weights(ranks[0])):
                np.testing.assert_array_equal(a, b)


def test_one_two_three_ranks_end_with_the_same_weights(runs):
    # Summed (not averaged) gradients of the masked loss: the update is the mean over the step's real
    # samples whatever the world size, the split (2 ranks were rebalanced to 1:2) or the padding.
    ref = _weights(runs[1][0])
    for world in (2, 3):
        for i, (w, r) in enumerate(zip(_weights(runs[world][0]), ref)):
            np.testing.assert_allclose(w, r, rtol=1e-4, atol=1e-5, err_msg=f"weight {i}, {world} ranks vs 1")


def test_evaluation_counts_every_test_sample_once(runs):
    for world, ranks in runs.items():
        accuracies = {float(f["eval_accuracy"]) for f in ranks}
        assert [int(f["eval_count"]) for f in ranks] == [SPEC["eval_n"]] * world
        assert len(accuracies) == 1  # all-reduced: every rank reports the same figure


def test_killed_rank_stops_the_others_with_a_clear_error_and_a_rerun_resumes_exactly(runs, warm_workers):
    ckpt = str(warm_workers.root / "ckpt")
    spec = dict(SPEC, checkpoint_dir=ckpt, checkpoint_every=2, die_at=[2, 0, 5], pg_timeout=15)
    (killed,) = warm_workers([(spec, 3, "kill")], timeout=60)
    assert killed[2].returncode == -9  # SIGKILL, as with kill -9
    for r in (0, 1):
        run = killed[r]
        assert run.returncode == 3, f"rank {r} exit code {run.returncode}:\n{run.stderr[-2000:]}"
        assert "lost contact with another rank after Cursor(0, 5)" in run.stderr, run.stderr[-2000:]
        assert "ckpt-00000-000004" in run.stderr and "run the same command again" in run.stderr
        assert run.seconds - killed[2].seconds < spec["pg_timeout"]
    (resumed,) = warm_workers([(dict(spec, die_at=None, resume=True), 3, "resume")], timeout=60)
    plan = _plan()
    for r, run in enumerate(resumed):
        assert run.returncode == 0, run.stderr[-3000:]
        found = run.found
        assert found["start"].tolist() == [0, 4]
        # The rerun trains exactly the plan's remainder from Cursor(0, 4) ...
        assert [tuple(c) for c in found["cursors"]] == [(0, s) for s in range(5, plan.num_steps + 1)] + [
            (1, s) for s in range(1, plan.num_steps + 1)]
        # ... and ends bitwise where the uninterrupted 3-rank run ended (momentum buffers restored too).
        for a, b in zip(_weights(found), _weights(runs[3][r])):
            np.testing.assert_array_equal(a, b)
    rest = np.concatenate([np.concatenate([f.found["seen"][k] for f in resumed]) for k in range(plan.num_steps - 4)])
    done = np.concatenate([plan.epoch(0).step_ids(s) for s in range(4)])
    np.testing.assert_array_equal(np.sort(np.concatenate([done, rest[rest >= 0]])), np.arange(SPEC["n"]))
