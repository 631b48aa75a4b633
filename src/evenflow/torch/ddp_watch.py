"""A plain ``DistributedDataParallel`` under evenflow's exact loss: made to sum, or refused.

:func:`~evenflow.torch.exact.masked_mean` is each rank's share of the step's mean loss
(``sum(mask * loss) / global_real_count``), so the shares' gradients must be **summed** over the
ranks. ``DistributedDataParallel``'s own all-reduce averages them, i.e. divides the exact
gradient by R once more: a user who writes the usual ``DistributedDataParallel(model)`` instead
of :func:`~evenflow.torch.exact.exact_ddp` would train another model with no error.

So the evenflow pieces of a user's loop (``plan_loader``, the :class:`PlanBatchSampler` and
``masked_mean``) watch the DDP modules that run a forward pass (:func:`watch_ddp`, one global
forward pre-hook, in a process group of more than one rank only), and ``masked_mean`` checks,
before the backward pass, each DDP whose parameters its loss depends on (:func:`check_ddp`),
once per DDP:

* one with evenflow's own gradient-sum hook (:func:`~evenflow.torch.exact.exact_ddp`) is exact;
* one with DDP's default averaging (no hook) gets evenflow's ring SUM hook registered, which is
  what ``exact_ddp`` does, and a ``UserWarning`` saying so;
* one with a hook of its own (a user's, a compression hook, a builtin one) is refused with one
  line naming ``exact_ddp``: evenflow cannot tell whether it sums.

A DDP whose first forward ran before anything was watching is found once, at the first
``masked_mean``, among the live objects.
"""
from __future__ import annotations

import gc
import warnings
import weakref

from evenflow.torch._lazy import torch as _torch
from evenflow.torch.distributed import (fp16_ordered_sum_hook, fp16_sum_hook, gradient_hook, ordered_sum_hook,
                                        sum_gradients_hook)

_PENDING: "weakref.WeakSet" = weakref.WeakSet()   # DDPs that ran a forward and were not checked yet
_CHECKED: "weakref.WeakSet" = weakref.WeakSet()   # DDPs checked (exact, made exact, or not this loss's)
_WATCH = {"handle": None, "scanned": False}


def _multi_rank() -> bool:
    dist = _torch().distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def watch_ddp() -> None:
    """Note every ``DistributedDataParallel`` that runs a forward pass from now on (once per process).

    Nothing is installed in a process without a process group of more than one rank, where DDP's
    average equals the sum.
    """
    if _WATCH["handle"] is not None or not _multi_rank():
        return
    torch = _torch()
    ddp_class = torch.nn.parallel.DistributedDataParallel

    def seen(module, args):
        if isinstance(module, ddp_class) and module not in _CHECKED:
            _PENDING.add(module)

    _WATCH["handle"] = torch.nn.modules.module.register_module_forward_pre_hook(seen)


def check_ddp(loss) -> None:
    """Make every unchecked DDP that ``loss`` depends on sum its gradients, or refuse it (module docstring).

    Raises:
        ValueError: a DDP ``loss`` depends on has a communication hook that is not evenflow's.
    """
    if not _multi_rank():
        return
    torch = _torch()
    if not _WATCH["scanned"]:  # a DDP built and run before anything watched
        _WATCH["scanned"] = True
        ddp_class = torch.nn.parallel.DistributedDataParallel
        _PENDING.update(o for o in gc.get_objects() if isinstance(o, ddp_class) and o not in _CHECKED)
        watch_ddp()
    if not len(_PENDING) or loss.grad_fn is None:
        return
    leaves = _leaf_ids(loss.grad_fn)
    for ddp in list(_PENDING):
        _PENDING.discard(ddp)
        _CHECKED.add(ddp)
        if any(id(p) in leaves for p in ddp.module.parameters()):
            _make_sum(ddp)


def _leaf_ids(grad_fn) -> set[int]:
    """The ids of the leaf tensors (parameters) an autograd graph accumulates gradients into."""
    found, seen, todo = set(), set(), [grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.add(id(variable))
        todo.extend(fn for fn, _ in node.next_functions)
    return found


def _make_sum(ddp) -> None:
    """Register evenflow's SUM hook on an averaging DDP; accept evenflow's own hooks; refuse any other."""
    hooks = [hook for hook, _ in getattr(ddp, "_comm_hooks", [])]
    if hooks and all(h in (sum_gradients_hook, ordered_sum_hook, fp16_sum_hook, fp16_ordered_sum_hook)
                     for h in hooks):
        return
    refusal = ("masked_mean divides by the step's real samples over all ranks, so the ranks' gradients must be "
               "summed, and this DistributedDataParallel has a communication hook of its own ({}), which may "
               "average; wrap the plain model with evenflow.torch.exact_ddp(model) instead")
    if hooks:
        raise ValueError(refusal.format(", ".join(getattr(h, "__qualname__", repr(h)) for h in hooks)))
    try:
        ddp.register_comm_hook(ddp.process_group, gradient_hook("ring"))
    except RuntimeError:  # a builtin hook (DDP takes one hook only)
        raise ValueError(refusal.format("a builtin one")) from None
    warnings.warn("evenflow: this DistributedDataParallel averaged gradients over the ranks, which divides "
                  "masked_mean's exact loss by the world size once more; evenflow registered its gradient-sum hook "
                  "on it (what evenflow.torch.exact_ddp(model) does), so each update is the step's exact mean",
                  UserWarning, stacklevel=3)
