"""The plan inside a user's own ``DataLoader``: ``PlanBatchSampler``, the exact loss, plain DDP, and the position.

``_user_loader_worker.py`` runs a user's loop over ``DataLoader(dataset, batch_sampler=plan_sampler(...),
collate_fn=own, num_workers=1)`` on 1 process and on 2 gloo ranks (127.0.0.1, hard deadline): the same
loss curve and weights, every sample once per epoch, the same number of steps on every rank; a plain
``DistributedDataParallel`` is made to sum, one with a hook of its own is refused naming ``exact_ddp``.
The position tests read each rank's batches in this process (``rank=``/``world_size=``): stop
mid-epoch, save ``state_dict()``, restore in a fresh loader or sampler on 2, 3 and 1 ranks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import evenflow as ef
import evenflow.torch as et
from tests.torch._own_datasets import N, arrays
from tests.torch.conftest import one_and_two_ranks, saved_params

WORKER = Path(__file__).with_name("_user_loader_worker.py")
STEPS = 7  # ceil(203 / 30) per epoch; the last step has 23 samples, split unevenly with padding


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return one_and_two_ranks(WORKER, tmp_path_factory.mktemp("user_loader"), timeout=120)



@pytest.mark.parametrize("name", ["short", "pad"])
def test_own_dataloader_with_the_sampler_trains_on_two_ranks_as_on_one(runs, name):
    one, (r0, r1) = runs
    assert one[f"{name}_loss"].shape == (2 * STEPS,) and r0[f"{name}_loss"].shape == (2 * STEPS,)  # equal steps
    np.testing.assert_allclose(r0[f"{name}_loss"], one[f"{name}_loss"], rtol=1e-5)
    for a, b, c in zip(saved_params(r0, name), saved_params(r1, name), saved_params(one, name)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
    assert one[f"{name}_loss"][-1] < 0.6 * one[f"{name}_loss"][0]


@pytest.mark.parametrize("name", ["short", "pad"])
def test_every_sample_once_per_epoch_and_the_batch_layouts(runs, name):
    one, ranks = runs
    for e in range(2):
        steps = slice(e * STEPS, (e + 1) * STEPS)
        seen = np.concatenate([f[f"{name}_ids"][steps].ravel() for f in ranks])
        np.testing.assert_array_equal(np.sort(seen[seen >= 0]), np.arange(N))
    real = [(f[f"{name}_ids"] >= 0).sum(axis=1) for f in ranks]
    if name == "pad":  # every batch the plan's slots (15 per rank), padding after the real rows
        assert all((f["pad_rows"] == 15).all() for f in ranks)
    else:  # the real rows only: 15 + 15, and the last step's 23 split 12 + 11
        for f, k in zip(ranks, real):
            np.testing.assert_array_equal(f["short_rows"], np.maximum(k, 1))
        assert sorted(r[STEPS - 1] for r in real) == [11, 12]


def test_plain_ddp_is_made_to_sum_and_a_ddp_with_its_own_hook_is_refused(runs):
    one, (r0, r1) = runs
    assert int(r0["short_warned"]) == 1 and int(r0["pad_warned"]) == 0  # exact_ddp needs no warning
    assert int(one["short_warned"]) == 0  # one process: DDP's average is the sum
    for f in (r0, r1):
        message = str(f["refused"])
        assert "communication hook of its own (allreduce_hook)" in message
        assert "evenflow.torch.exact_ddp(model)" in message and "\n" not in message


# --- the position: state_dict / load_state_dict, restored on another number of ranks -------------------

def _dataset():
    x, y = arrays()
    return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(N))


def _plan(world: int) -> ef.Plan:
    return ef.Plan(ef.Index(N), ef.Topology(world), global_batch_size=30, seed=3)


@pytest.mark.parametrize("resume_world", [2, 3, 1])
def test_plan_loader_resumes_mid_epoch_on_any_world_size_with_the_rest_of_the_epoch(resume_world):
    source = et.DatasetSource(_dataset())
    seen, states = [], []
    for r in range(2):  # 2 ranks read 3 steps of epoch 1 with 2 workers loading ahead, then stop
        loader = et.PlanLoader(source, _plan(2), rank=r, world_size=2, start=ef.Cursor(1, 0), epochs=3,
                               num_workers=2)
        it = iter(loader)
        seen += [next(it)["id"].numpy() for _ in range(3)]
        it.close()
        states.append(loader.state_dict())
    assert states[0] == states[1] and states[0]["epoch"] == 1 and states[0]["step"] == 3
    rest = []
    for r in range(resume_world):
        fresh = et.PlanLoader(source, _plan(resume_world), rank=r, world_size=resume_world, epochs=3)
        fresh.load_state_dict(states[0])
        assert len(fresh) == STEPS - 3 + STEPS
        rest += [b["id"].numpy() for b in fresh if int(b["epoch"]) == 1]
    ids = np.concatenate(seen + rest)
    np.testing.assert_array_equal(np.sort(ids[ids >= 0]), np.arange(N))


@pytest.mark.parametrize("resume_world", [2, 3, 1])
@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_resumes_mid_epoch_on_any_world_size_with_the_rest_of_the_epoch(resume_world, workers):
    dataset = _dataset()
    seen, states = [], []
    for r in range(2):
        sampler = et.plan_sampler(dataset, 30, seed=3, rank=r, world_size=2)
        sampler.set_epoch(1)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
        for step, (_, _, i) in enumerate(loader, sampler.first_step):
            seen.append(i.numpy())
            if step == 2:  # the loop's position: with workers the DataLoader has read ahead
                states.append(sampler.state_dict(next_step=step + 1) if workers else sampler.state_dict())
                break
    assert states[0] == states[1] == {**states[0], "epoch": 1, "step": 3, "replicas": 2}
    rest = []
    for r in range(resume_world):
        fresh = et.plan_sampler(dataset, 30, seed=3, rank=r, world_size=resume_world)
        fresh.load_state_dict(states[0])
        assert (fresh.epoch, fresh.first_step, len(fresh)) == (1, 3, STEPS - 3)
        fresh.set_epoch(1)  # the loop's own set_epoch keeps the restored step
        rest += [i.numpy() for _, _, i in torch.utils.data.DataLoader(dataset, batch_sampler=fresh)]
        assert fresh.state_dict()["epoch"] == 2 and fresh.state_dict()["step"] == 0  # the epoch is done
    ids = np.concatenate(seen + rest)
    np.testing.assert_array_equal(np.sort(ids), np.arange(N))  # short batches: no padding at all


def test_a_state_of_another_plan_is_refused_naming_the_fingerprints():
    state = et.plan_sampler(_dataset(), 30, seed=3, rank=0, world_size=1).state_dict()
    other = et.plan_sampler(_dataset(), 30, seed=4, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"saved reading plan .*-s3-.* but this PlanBatchSampler reads plan .*-s4-"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="has no step, plan, replicas"):
        other.load_state_dict({"epoch": 0})
