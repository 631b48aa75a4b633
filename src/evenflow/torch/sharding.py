"""Sharded parameters: a model's parameters, gradients and optimizer state split across the ranks.

:func:`shard_model` applies PyTorch's FSDP (``torch.distributed.fsdp.fully_shard``) to every
submodule that holds parameters of its own, then to the whole model. Each rank then keeps
about 1/R of every parameter, of its gradient and of the optimizer's state for it; a layer's
full parameters exist on a rank only while that layer runs (all-gathered before its forward
and backward pass, freed after), and its gradients are reduce-scattered so that each rank
receives the sum for its own shard. Build the optimizer *after* sharding: it must hold the
sharded parameters.

The plan does not change: every rank still trains on its row of each step, and the masked
loss divides by the step's real count over all ranks; :func:`sum_gradients` makes the
reduce-scatter add the ranks' gradients instead of averaging them (FSDP's default), so an
update is the gradient of the mean over the step's real samples, as under DDP.

A rank has no compute time of its own here: every layer's all-gather waits for all ranks,
so a slow rank slows each layer of every other one. Step timings include that wait, and
rebalancing from them is refused (see :mod:`evenflow.torch.adapter`).
"""
from __future__ import annotations

import contextlib

from evenflow.torch._lazy import torch as _torch
from evenflow.torch.distributed import group_ready


def _fsdp():
    from torch.distributed import fsdp

    return fsdp


def is_sharded(model) -> bool:
    """True when ``model`` was sharded with ``fully_shard`` (by :func:`shard_model` or by hand)."""
    return isinstance(model, _fsdp().FSDPModule)


def fsdp_modules(model) -> list:
    """The model's sharded modules (``FSDPModule``), the model itself included."""
    kind = _fsdp().FSDPModule
    return [m for m in model.modules() if isinstance(m, kind)]


def shard_model(model, device=None):
    """Shard ``model`` in place across the process group's ranks and return it.

    Every submodule with parameters of its own (a ``Linear``, a ``Conv2d``) becomes one
    FSDP unit, then the model: a rank holds one unit's full parameters at a time. Call
    after the process group is up (:func:`~evenflow.torch.distributed.init_distributed`)
    and before making the optimizer. Gradients are summed over ranks (:func:`sum_gradients`).
    Without a process group (a plain ``python train.py``) there is nothing to shard across:
    ``model`` is returned unsharded (moved to ``device``), as ``evenflow train`` does on one
    process.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: the model has no parameters, is sharded already, or shares a parameter
            between two modules (tied weights: each unit shards its own parameters); or
            ``WORLD_SIZE`` > 1 (torchrun) but no process group yet.
    """
    torch = _torch()
    fsdp = _fsdp()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"shard_model takes a torch.nn.Module, got {type(model).__name__}")
    if is_sharded(model):
        raise ValueError("the model is sharded already (fully_shard was applied to it); pass it as it is")
    if not any(True for _ in model.parameters()):
        raise ValueError("the model has no parameters to shard")
    _check_untied(model)
    if device is not None:
        model.to(torch.device(device))
    if not group_ready():
        return model
    units = [m for m in model.modules() if m is not model and any(True for _ in m.parameters(recurse=False))]
    for unit in units:
        fsdp.fully_shard(unit)
    fsdp.fully_shard(model)
    sum_gradients(model)
    return model


def _check_untied(model) -> None:
    """Refuse a parameter held by two modules: FSDP would shard it twice, and the first forward would fail."""
    owner = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False, remove_duplicate=False):
            where = f"{name}.{pname}" if name else pname
            first = owner.setdefault(id(p), (module, name, where))
            if first[0] is not module:
                raise ValueError(f"shard_model shards each module's own parameters, and {where!r} is the same "
                                 f"parameter as {first[2]!r} (modules {first[1] or '<the model>'!r} and "
                                 f"{name or '<the model>'!r}, e.g. tied weights); untie them, or train the "
                                 f"model unsharded with exact_ddp")


def sum_gradients(model) -> None:
    """Make every FSDP unit of ``model`` add the ranks' gradients (FSDP averages them by default).

    A plain SUM reduce-scatter with no division after it: the collective every backend has
    (gloo has neither AVG nor the pre-multiplied sum FSDP uses for a divide factor).
    """
    for unit in fsdp_modules(model):
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def local_tensor(t):
    """This rank's shard of a sharded (``DTensor``) tensor; any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


@contextlib.contextmanager
def gradient_sync_off(model):
    """Backward passes accumulate this rank's unsharded gradients without reduce-scattering them."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
