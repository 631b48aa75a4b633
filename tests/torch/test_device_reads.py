"""Reads that keep the device's queue full: the fused non-finite check, deferred host copies, the loss's
denominator written on the device, and the loader's small arrays that ride inside the pickled batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import evenflow as ef
from evenflow.torch import ArraySource, PlanLoader
from evenflow.torch.device_reads import HostCopy, nonfinite_flag
from evenflow.torch.loader import INLINE_BYTES
from evenflow.torch.losses import loss_denominator


def _grads():
    g = [torch.randn(7, dtype=torch.float32), torch.randn(3, 4, dtype=torch.float64),
         torch.randn(5).to(torch.bfloat16)]
    g[0][0], g[0][1] = -0.0, 1e-45  # a negative zero and a subnormal keep their bits through the check
    return g


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-tensor"])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_nonfinite_flag_finds_any_nan_or_inf_and_leaves_every_bit(monkeypatch, fused, bad):
    if not fused:  # a build or dtype without the fused check takes the per-tensor way, with the same answer
        monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_",
                            lambda *a: (_ for _ in ()).throw(RuntimeError("no fused check")))
    grads = _grads()
    if bad is not None:
        grads[1][2, 3] = bad
    before = [g.clone() for g in grads]
    flag = nonfinite_flag(grads)
    assert flag.dtype == torch.float32 and flag.shape == () and float(flag) == (0.0 if bad is None else 1.0)
    for g, b in zip(grads, before):
        assert torch.equal(g.view(torch.int8 if g.dtype != torch.float64 else torch.int64).flatten(),
                           b.view(torch.int8 if b.dtype != torch.float64 else torch.int64).flatten())


def test_host_copy_reads_the_values_it_was_given():
    sums = torch.tensor([1.5, 2.0, 3.0])
    copy = HostCopy(sums)
    assert np.array_equal(copy.numpy(), [1.5, 2.0, 3.0])


@pytest.mark.parametrize("count", [0, 1, 7, 2**24 - 1])
def test_loss_denominator_is_the_clamped_count_in_float32_from_a_number_or_a_tensor(count):
    expected = np.float32(max(count, 1))
    for given in (count, float(count), torch.tensor(count)):
        value = loss_denominator(given, "cpu")
        assert value.dtype == torch.float32 and value.shape == () and value.item() == expected


def test_small_arrays_travel_inside_the_batch_and_arrive_as_tensors():
    n = 64
    x = np.random.default_rng(0).normal(size=(n, INLINE_BYTES // 4 // 16 + 1)).astype(np.float32)  # over the limit
    y = np.arange(n) % 4
    small = np.arange(n * 2, dtype=np.int64).reshape(n, 2)
    source = ArraySource(x, y, extra={"small": small})
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=16, seed=0)
    loader = PlanLoader(source, plan, num_workers=1)
    raw = next(iter(loader.data_loader()))  # what a worker hands over
    assert all(isinstance(raw[k], np.ndarray) for k in ("label", "id", "small"))  # 16 rows: under the limit
    assert isinstance(raw["features"], torch.Tensor)  # 16 rows of 4 KiB: a shared-memory tensor
    seen = []
    for batch in loader:
        for key, dtype in (("features", torch.float32), ("label", torch.int64), ("id", torch.int64),
                           ("mask", torch.float32), ("small", torch.int64)):
            assert isinstance(batch[key], torch.Tensor) and batch[key].dtype == dtype, key
        ids = batch["id"].numpy()
        assert np.array_equal(batch["label"].numpy(), y[ids]) and np.array_equal(batch["features"].numpy(), x[ids])
        assert np.array_equal(batch["small"].numpy(), small[ids])
        seen += ids.tolist()
    assert sorted(seen) == list(range(n))
