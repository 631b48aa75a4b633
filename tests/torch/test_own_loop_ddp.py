"""A user's own DDP loop over a user's own Dataset: 2 gloo ranks train exactly like 1 process.

``_own_loop_worker.py`` is the loop a PyTorch user writes with ``plan_loader``, ``exact_ddp``
and ``masked_mean`` and nothing else from evenflow, run on three datasets: dict items read
through ``__getitems__``, tuple items read one ``__getitem__`` at a time in a forked loader
worker (stratified by its ``.targets``), and a ``TensorDataset``. N = 203 samples, global
batch 30: the last step has 23 samples, which 2 ranks split unevenly, with padding. One
process (no process group) and 2 ranks run at once, on 127.0.0.1 with a hard deadline.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.torch._own_datasets import N, arrays
from tests.torch.conftest import one_and_two_ranks, saved_params

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_own_loop_worker.py")
KINDS = ("getitems", "getitem", "tensors")
STEPS = 2 * 7  # two epochs of ceil(203 / 30) steps


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return one_and_two_ranks(WORKER, tmp_path_factory.mktemp("own_loop"), timeout=150)



@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_give_the_loss_curve_and_weights_of_one_process(runs, kind):
    one, (r0, r1) = runs
    assert one[f"{kind}_loss"].shape == (STEPS,)
    np.testing.assert_allclose(r0[f"{kind}_loss"], one[f"{kind}_loss"], rtol=1e-5)
    np.testing.assert_array_equal(r0[f"{kind}_loss"], r1[f"{kind}_loss"])  # the same all-reduced curve
    for a, b, c in zip(saved_params(r0, kind), saved_params(r1, kind), saved_params(one, kind)):
        np.testing.assert_array_equal(a, b)  # DDP keeps the ranks identical
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
    assert one[f"{kind}_loss"][-1] < 0.6 * one[f"{kind}_loss"][0]  # and it learned


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_is_read_exactly_once_per_epoch_on_two_ranks_as_on_one(runs, kind):
    one, ranks = runs
    for e in range(2):
        steps = slice(e * 7, (e + 1) * 7)
        seen = np.concatenate([f[f"{kind}_ids"][steps].ravel() for f in ranks])
        np.testing.assert_array_equal(np.sort(seen[seen >= 0]), np.arange(N))
        for s in range(e * 7, (e + 1) * 7):  # each step: the same samples, whoever read them
            two = np.concatenate([f[f"{kind}_ids"][s] for f in ranks])
            alone = one[f"{kind}_ids"][s]
            np.testing.assert_array_equal(np.sort(two[two >= 0]), np.sort(alone[alone >= 0]))


@pytest.mark.parametrize("kind", KINDS)
def test_one_process_curve_is_a_plain_loop_over_the_mean_of_each_steps_samples(runs, kind):
    one, _ = runs
    x, y = (torch.from_numpy(a) for a in arrays())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    curve = []
    for ids in one[f"{kind}_ids"]:
        real = torch.from_numpy(ids[ids >= 0])
        loss = torch.nn.functional.cross_entropy(model(x[real]), y[real])  # plain PyTorch: the batch mean
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curve.append(loss.item())
    np.testing.assert_allclose(one[f"{kind}_loss"], curve, rtol=1e-5)
    for mine, plain in zip(saved_params(one, kind), model.parameters()):
        np.testing.assert_allclose(mine, plain.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_plain_ddp_under_masked_mean_is_made_to_sum_and_trains_the_one_process_model(runs):
    # DistributedDataParallel's own hook would divide every gradient by 2 (the weights end 0.31 away);
    # masked_mean registers evenflow's sum hook on it before the first backward, and says so once.
    one, (r0, r1) = runs
    for a, b, c in zip(saved_params(r0, "plain_ddp"), saved_params(r1, "plain_ddp"), saved_params(one, "tensors")):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(r0["plain_ddp_loss"], one["tensors_loss"], rtol=1e-5)
    assert int(r0["plain_ddp_warned"]) == 1 and int(r0["tensors_warned"]) == 0
