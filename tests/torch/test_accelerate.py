"""Accelerate with evenflow: ``accelerator.prepare(model, optimizer)`` trains on 2 CPU processes as on 1.

``_accelerate_worker.py`` runs the loop the docs show on 1 process and on 2 (Accelerate's own gloo
group on 127.0.0.1, hard deadline): the user's ``DataLoader`` with ``plan_sampler`` and a
``plan_loader``, both left unprepared (Accelerate would split their batches over the processes a
second time). Each sample is trained once per epoch and the weights equal one process's; preparing
the DataLoader with the sampler is refused at its first batch, naming the fix.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.torch._own_datasets import N
from tests.torch.conftest import one_and_two_ranks

pytest.importorskip("accelerate")

WORKER = Path(__file__).with_name("_accelerate_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return one_and_two_ranks(WORKER, tmp_path_factory.mktemp("accelerate"), timeout=120)


@pytest.mark.parametrize("name", ["sampler", "loader"])
def test_prepared_model_and_optimizer_train_each_sample_once_and_end_with_one_process_weights(runs, name):
    one, (r0, r1) = runs
    assert int(one["processes"]) == 1 and int(r0["processes"]) == 2
    ids = np.concatenate([r0[f"{name}_ids"], r1[f"{name}_ids"]])
    np.testing.assert_array_equal(np.sort(ids), np.sort(np.concatenate([np.arange(N)] * 2)))  # 2 epochs
    np.testing.assert_array_equal(np.sort(one[f"{name}_ids"]), np.sort(ids))
    for k in range(4):
        np.testing.assert_array_equal(r0[f"{name}_p{k}"], r1[f"{name}_p{k}"])
        np.testing.assert_allclose(r0[f"{name}_p{k}"], one[f"{name}_p{k}"], rtol=1e-4, atol=1e-6)


def test_preparing_the_dataloader_with_the_sampler_is_refused_naming_the_fix(runs):
    _, ranks = runs
    for f in ranks:
        message = str(f["refused"])
        assert "BatchSamplerShard would give each process 1 of every 2 of them" in message
        assert "model, optimizer = accelerator.prepare(model, optimizer)" in message
