"""``exact_ddp`` on 2 real gloo ranks: fp16 sums that cannot overflow, DDP's own process group, a sharded model.

``_exact_worker.py`` runs once per rank on 127.0.0.1 with a hard deadline (see its docstring
for what it records).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.torch.conftest import rank_python, run_ranks

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_exact_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    (runs,) = run_ranks([(lambda r: [*rank_python(), str(WORKER), str(root / f"r{r}.npz")], 2,
                          lambda r: root / f"r{r}.npz")], timeout=120)
    for r, run in enumerate(runs):
        assert run.returncode == 0 and run.found is not None, f"rank {r} failed:\n{run.stderr[-3000:]}"
    return [run.found for run in runs]


def test_init_distributed_returns_the_rank_and_world_of_a_group_started_by_hand(ranks):
    for r, found in enumerate(ranks):
        np.testing.assert_array_equal(found["init"], [r, 2])


@pytest.mark.parametrize("kind", ["ring", "ordered"])
def test_fp16_compression_sums_gradients_that_fit_float16_without_overflow(ranks, kind):
    for found in ranks:
        assert found[f"{kind}_fp16"][0] == 80000.0  # each rank 40000 (< 65504), their sum does not fit float16


def test_fp16_ordered_sum_adds_the_float16_gradients_in_rank_order_in_float32(ranks):
    # 1 and 1 + 1/1024 are float16 numbers: their float32 sum is exact, the same bits on both ranks.
    for found in ranks:
        assert found["ordered_fp16"][1] == np.float32(1.0) + np.float32(1 + 1 / 1024)


def test_fp16_ring_sum_carries_the_float16_rounding_of_the_mean(ranks):
    exact = 2 + 1 / 1024
    mean_in_half = float(np.float16(1 / 2) + np.float16((1 + 1 / 1024) / 2))
    for found in ranks:
        assert found["ring_fp16"][1] == pytest.approx(2 * mean_in_half, abs=0)
        assert abs(found["ring_fp16"][1] - exact) <= exact * 2.0 ** -10
    assert ranks[0]["ring_fp16"][1] == ranks[1]["ring_fp16"][1]


@pytest.mark.parametrize("how", ["own", "wrapped"])
@pytest.mark.parametrize("compression", ["none", "fp16"])
@pytest.mark.parametrize("kind", ["ring", "ordered"])
def test_gradients_are_summed_over_ddps_process_group_not_the_whole_world(ranks, kind, compression, how):
    # Each rank's DDP runs over a one-rank group of its own: its gradient is its own (rank + 1), not the sum 3.
    for r, found in enumerate(ranks):
        assert float(found[f"{kind}_{compression}_{how}"]) == r + 1.0


def test_exact_ddp_refuses_a_sharded_model(ranks):
    for found in ranks:
        assert str(found["sharded_refused"]).startswith("error:TypeError: exact_ddp wraps a model in DistributedDataParallel, and "
                                                        "this one is sharded (shard_model or fully_shard)")
