"""One process, no process group: the helpers of a user's own loop refuse what would train the wrong thing.

A script started by torchrun (``WORLD_SIZE`` > 1) that builds a loader, ``exact_ddp`` or
``shard_model`` before :func:`init_distributed` would act as rank 0 of 1 in every process;
``init_distributed``, ``masked_mean``, ``PlanSteps``, ``shard_model`` and ``packed_text_cnn``
refuse bad arguments with one line instead of a raw torch error later.
"""
from __future__ import annotations

import datetime

import numpy as np
import pytest
import torch

import evenflow as ef
import evenflow.torch as et
from evenflow.torch.distributed import finish_distributed
from tests.torch.conftest import free_port

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def alone(monkeypatch):
    """A plain ``python train.py``: none of torchrun's variables, no process group."""
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    assert not torch.distributed.is_initialized()
    return monkeypatch


@pytest.fixture
def launched(alone):
    """Rank 1 of 2 as torchrun starts it, before any process group exists."""
    for key, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="29999").items():
        alone.setenv(key, value)
    return alone


def _dataset():
    return torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10) % 2)


@pytest.mark.parametrize("build", [
    lambda: et.rank_and_world_size(),
    lambda: et.plan_loader(_dataset(), global_batch_size=10, seed=0),
    lambda: et.exact_ddp(torch.nn.Linear(2, 2)),
    lambda: et.shard_model(torch.nn.Linear(2, 2)),
], ids=["rank_and_world_size", "plan_loader", "exact_ddp", "shard_model"])
def test_torchrun_without_a_process_group_is_refused_not_run_as_rank_0_of_1(launched, build):
    with pytest.raises(ValueError, match=r"WORLD_SIZE is 2 but no process group exists: call "
                                         r"evenflow.torch.init_distributed\(\) first"):
        build()


def test_explicit_rank_and_world_size_need_no_process_group(launched):
    assert et.rank_and_world_size(1, 2) == (1, 2)


def test_a_lone_process_is_rank_0_of_1_and_keeps_its_model(alone):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert et.rank_and_world_size() == (0, 1)
    assert et.exact_ddp(model) is model
    assert et.shard_model(model) is model and not any("FSDP" in type(m).__name__ for m in model.modules())


@pytest.mark.parametrize("backend", ["GLOO", "gloo", "auto", "Auto", None])
def test_init_distributed_takes_the_clis_backend_words_in_any_case(alone, backend):
    if backend in (None, "auto", "Auto") and torch.cuda.is_available():
        pytest.skip("auto picks nccl here")
    assert et.init_distributed(backend) == (0, 1, torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_init_distributed_refuses_nccl_without_cuda(alone):
    with pytest.raises(ValueError, match=r"backend 'nccl' needs a CUDA GPU.*use backend='gloo'"):
        et.init_distributed("nccl")


@pytest.mark.parametrize("backend", ["mpi", 3])
def test_init_distributed_refuses_an_unknown_backend(alone, backend):
    with pytest.raises(ValueError, match=r"backend must be one of 'auto', 'gloo', 'nccl' or None"):
        et.init_distributed(backend)


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), "30", True])
def test_init_distributed_refuses_a_timeout_that_is_not_a_finite_positive_number(alone, timeout):
    with pytest.raises(ValueError, match=r"timeout_s must be (greater than 0|finite|a number), got .*; "
                                         r"the process-group timeout in seconds"):
        et.init_distributed(timeout_s=timeout)


@pytest.mark.parametrize("key,value", [("RANK", "zero"), ("WORLD_SIZE", ""), ("LOCAL_RANK", "x"),
                                       ("MASTER_PORT", "notaport")])
def test_init_distributed_names_an_environment_variable_that_is_not_an_integer(launched, key, value):
    launched.setenv(key, value)
    if key == "LOCAL_RANK":  # read for nccl's device only
        if not torch.cuda.is_available():
            pytest.skip("LOCAL_RANK is read under nccl only")
        launched.setenv("WORLD_SIZE", "1")
        launched.setenv("RANK", "0")
    with pytest.raises(ValueError, match=rf"the environment variable {key} must be an integer, got {value!r}"):
        et.init_distributed("nccl" if key == "LOCAL_RANK" else "gloo", timeout_s=5)


def test_finish_distributed_destroys_the_group_even_when_its_barrier_fails(alone, monkeypatch):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        def lost(*args, **kwargs):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
        monkeypatch.setattr(dist, "barrier", lost)
        with pytest.raises(RuntimeError, match="Connection closed by peer"):
            finish_distributed()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _batch(mask, count=None):
    batch = {"mask": torch.tensor(mask, dtype=torch.float32)}
    if count is not None:
        batch["global_real_count"] = torch.tensor(count)
    return batch


@pytest.mark.parametrize("count", [0, -3, 0.5, 1, float("nan"), float("inf")])
def test_masked_mean_refuses_a_count_below_this_ranks_real_samples(count):
    with pytest.raises(ValueError, match=rf"masked_mean's count is the step's real samples over all ranks, so it "
                                         rf"must be a finite number >= this rank's 2 real samples, got"):
        et.masked_mean(torch.full((3,), 2.0), _batch([1, 1, 0]), count=count)


def test_masked_mean_checks_the_batchs_own_count_too():
    with pytest.raises(ValueError, match=r"masked_mean's batch\['global_real_count'\] is the step's real samples"):
        et.masked_mean(torch.full((3,), 2.0), _batch([1, 1, 0], count=0))


@pytest.mark.parametrize("count", ["2", True, [2, 4], torch.tensor([2, 2, 2]), None])
def test_masked_mean_refuses_a_count_that_is_not_one_number(count):
    batch = _batch([1, 1, 0], count=2) if count is None else _batch([1, 1, 0])
    if count is None:
        batch["global_real_count"] = None
    with pytest.raises(TypeError, match=r"must be one real number \(or a 0-d tensor\), got"):
        et.masked_mean(torch.full((3,), 2.0), batch, count=count)


@pytest.mark.parametrize("count,expected", [(2, 2.0), (np.int64(4), 1.0), (torch.tensor(4), 1.0), (4.0, 1.0)])
def test_masked_mean_divides_the_real_losses_by_a_valid_count(count, expected):
    loss = torch.tensor([2.0, 2.0, float("nan")])
    assert et.masked_mean(loss, _batch([1, 1, 0]), count=count).item() == expected


def test_masked_mean_of_padding_only_with_count_0_is_0():
    assert et.masked_mean(torch.full((3,), 5.0), _batch([0, 0, 0]), count=0).item() == 0.0


def test_masked_mean_counts_every_slot_with_mask_above_0_whole():
    # The docstring's rule: sum of the losses where mask > 0, not mask * loss.
    assert et.masked_mean(torch.tensor([2.0, 2.0, 2.0]), _batch([0.5, 1, 0]), count=2).item() == 2.0


@pytest.mark.parametrize("where", ["loss", "mask"])
def test_masked_mean_asks_for_torch_tensors(where):
    loss, batch = torch.full((3,), 2.0), _batch([1, 1, 0], count=2)
    if where == "loss":
        loss = loss.numpy()
    else:
        batch["mask"] = batch["mask"].numpy()
    name = "per_sample_loss" if where == "loss" else r"batch\['mask'\]"
    with pytest.raises(TypeError, match=rf"masked_mean needs {name} as a torch.Tensor, got ndarray"):
        et.masked_mean(loss, batch)


@pytest.mark.parametrize("kwargs,message", [
    ({"find_unused_parameter": True}, r"takes no argument 'find_unused_parameter'; did you mean "
                                      r"find_unused_parameters\?"),
    ({"foo": 1}, r"takes no argument 'foo'; it takes device_ids, "),
])
def test_exact_ddp_checks_ddp_arguments_without_a_process_group_too(alone, kwargs, message):
    with pytest.raises(TypeError, match=message):
        et.exact_ddp(torch.nn.Linear(2, 2), **kwargs)


def test_exact_ddp_passes_ddps_own_arguments_through_without_a_group(alone):
    model = torch.nn.Linear(2, 2)
    assert et.exact_ddp(model, find_unused_parameters=True, bucket_cap_mb=1) is model


@pytest.mark.parametrize("model", [lambda x: x, None])
def test_shard_model_takes_a_module_only(alone, model):
    with pytest.raises(TypeError, match=r"shard_model takes a torch.nn.Module, got"):
        et.shard_model(model)


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False)
        self.out.weight = self.emb.weight


def test_shard_model_refuses_a_parameter_shared_by_two_modules(alone):
    with pytest.raises(ValueError, match=r"'out.weight' is the same parameter as 'emb.weight' \(modules 'emb' and "
                                         r"'out', e.g. tied weights\); untie them"):
        et.shard_model(_Tied())


def test_shard_model_takes_a_module_used_twice(alone):
    layer = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(layer, torch.nn.Tanh(), layer)
    assert et.shard_model(model) is model


def _plan(replicas=2):
    return ef.Plan(ef.Index(10), ef.Topology(replicas), global_batch_size=4, seed=0)


@pytest.mark.parametrize("rank", [1.7, "1", True, np.float64(1.0)])
def test_plan_steps_refuses_a_rank_that_is_not_an_int(rank):
    with pytest.raises(TypeError, match=r"rank must be an integer, got"):
        et.PlanSteps(_plan(), rank)


@pytest.mark.parametrize("rank", [-1, 2, 5])
def test_plan_steps_refuses_a_rank_outside_the_plans_replicas_at_once(rank):
    with pytest.raises(ValueError, match=rf"rank must be at (least 0|most 1), got {rank}; one of the plan's replicas"):
        et.PlanSteps(_plan(), rank)


def test_plan_steps_takes_numpy_integers():
    steps = et.PlanSteps(_plan(), np.int64(1), epochs=np.int64(2))
    plain = et.PlanSteps(_plan(), 1, epochs=2)
    assert len(steps) == len(plain) == 2 * _plan().num_steps
    assert [k[2].tolist() for k in steps] == [k[2].tolist() for k in plain]


@pytest.mark.parametrize("kwargs,message", [
    ({"kernel": 4}, r"kernel must be odd \(centred on each position\), got 4; use 3 or 5"),
    ({"kernel": 0}, r"kernel must be at least 1, got 0"),
    ({"kernel": -3}, r"kernel must be at least 1, got -3"),
    ({"width": 0}, r"width must be at least 1, got 0"),
    ({"num_classes": 2.5}, r"num_classes must be an integer, got float \(2.5\)"),
])
def test_packed_text_cnn_refuses_bad_sizes_at_construction(kwargs, message):
    args = {"num_classes": 3, **kwargs}
    with pytest.raises(ValueError, match=rf"packed_text_cnn's {message}"):
        et.packed_text_cnn(**args)


@pytest.mark.parametrize("kernel", [1, 3, np.int64(5)])
def test_packed_text_cnn_runs_with_any_odd_kernel(kernel):
    tokens = torch.tensor([[5, 6, 7, 9, 10, 11, 12, 13, 0, 0]])
    segments = torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
    assert et.packed_text_cnn(np.int64(3), kernel=kernel)(tokens, segments, 3).shape == (3, 3)


def test_packed_text_cnn_refuses_fewer_slots_than_the_batch_has_samples():
    tokens = torch.tensor([[5, 6, 7, 9, 10, 11, 12, 13, 0, 0]])
    segments = torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
    model = et.packed_text_cnn(3)
    with pytest.raises(ValueError, match="holds segments up to 3 but slots is 2: pass the batch's number of slots"):
        model(tokens, segments, 2)  # sample 3 would be pooled into the dropped padding bucket
    assert model(tokens, segments, 3).shape == (3, 3)
