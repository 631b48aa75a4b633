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

__all__ = ["shard_model", "is_sharded", "sum_gradients", "fsdp_modules", "local_tensor", "gradient_sync_off"]


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

    Raises:
        ValueError: the model has no parameters, or is sharded already.
    """
    torch = _torch()
    fsdp = _fsdp()
    if is_sharded(model):
        raise ValueError("the model is sharded already (fully_shard was applied to it); pass it as it is")
    if not any(True for _ in model.parameters()):
        raise ValueError("the model has no parameters to shard")
    if device is not None:
        model.to(torch.device(device))
    units = [m for m in model.modules() if m is not model and any(True for _ in m.parameters(recurse=False))]
    for unit in units:
        fsdp.fully_shard(unit)
    fsdp.fully_shard(model)
    sum_gradients(model)
    return model


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
