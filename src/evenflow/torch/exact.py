"""The exact masked mean loss in a user's own DDP training loop, with no rescaling by hand.

An evenflow step splits ``global_real_count`` real samples unevenly over R ranks (and pads
the rest). Its correct loss is the mean over those samples, ``sum(all real losses) /
global_real_count``. Each rank computes its share of that mean with :func:`masked_mean`:
``sum(mask * loss) / global_real_count`` (its own real samples, the step's global count).
The shares add up to the mean, so the gradients must be **summed** over ranks. DDP's
default all-reduce averages them instead, i.e. divides by R once more, and a plain
``loss.mean()`` per rank would weigh a rank's samples by its share of the step. So:

* :func:`exact_ddp` wraps the model in ``DistributedDataParallel`` with evenflow's
  gradient-SUM communication hook;
* :func:`masked_mean` is each rank's share of the step's mean loss.

Then ``masked_mean(loss_fn(model(x), y), batch).backward(); optimizer.step()`` applies the
gradient of the mean over the step's real samples, the same on 1, 2 or 64 ranks.
"""
from __future__ import annotations

import difflib
import inspect
import math
import numbers

import numpy as np

from evenflow.torch._lazy import torch as _torch
from evenflow.torch.ddp_watch import check_ddp
from evenflow.torch.distributed import gradient_hook, group_ready
from evenflow.run.options import COMPRESSIONS
from evenflow.torch.engine import GRADIENT_SUMS
from evenflow.torch.losses import masked_loss
from evenflow.torch.sharding import is_sharded
from evenflow.util.validate import check_choice


def exact_ddp(model, *, gradient_sum: str = "ring", compression: str = "none", **ddp_kwargs):
    """``model`` under ``DistributedDataParallel`` that SUMS gradients over ranks (see the module docstring).

    Use it where a plain DDP loop has ``DistributedDataParallel(model, ...)``, and compute the
    loss with :func:`masked_mean`.

    Args:
        model: a ``torch.nn.Module`` (already on its device), or a ``DistributedDataParallel``
            without a communication hook (then the hook is registered on it). Not a model
            sharded by :func:`~evenflow.torch.sharding.shard_model`: that one sums already.
        gradient_sum: ``"ring"`` (DDP's own all-reduce, with SUM: the same traffic as plain DDP)
            or ``"ordered"`` (all-gather, then add in rank order: the same bits whatever DDP's
            bucket layout, so a resumed run is bitwise equal to an uninterrupted one; R buckets
            travel to every rank instead of about two).
        compression: ``"none"`` or ``"fp16"``: gradients travel in float16, and no sum overflows
            where each rank's gradient fits. ``"ring"`` adds up each rank's gradient / R in float16,
            times R in their own dtype after (the float16 rounding of the mean); ``"ordered"``
            adds the float16 gradients up in their own dtype.
        **ddp_kwargs: passed to ``DistributedDataParallel`` (``device_ids``, ``process_group``:
            the gradients are summed over it, ``find_unused_parameters``, ...), checked against
            its signature also without a group.

    Returns:
        the ``DistributedDataParallel`` module when a process group is initialised (also for a
        world of 1); otherwise, in a plain ``python train.py`` without ``torchrun``, ``model``
        itself: one process has nothing to sum, so the same script runs unchanged, and
        ``ddp_kwargs`` (DDP's own arguments) have nothing to act on.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``, or is sharded; an argument
            ``DistributedDataParallel`` does not take.
        ValueError: an unknown ``gradient_sum`` or ``compression``, DDP arguments with a model
            that is already a ``DistributedDataParallel``, or one that already has a hook;
            ``WORLD_SIZE`` > 1 (torchrun) but no process group yet.
    """
    torch = _torch()
    check_choice("gradient_sum", gradient_sum, GRADIENT_SUMS)
    check_choice("compression", compression, COMPRESSIONS)
    ddp_class = torch.nn.parallel.DistributedDataParallel
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"exact_ddp takes a torch.nn.Module (or a DistributedDataParallel), got {type(model).__name__}")
    if is_sharded(model):
        raise TypeError("exact_ddp wraps a model in DistributedDataParallel, and this one is sharded (shard_model or "
                        "fully_shard), which sums its gradients over ranks already; train it as it is")
    _check_ddp_kwargs(ddp_class, ddp_kwargs)
    if isinstance(model, ddp_class):
        if ddp_kwargs:
            raise ValueError(f"the model is already a DistributedDataParallel, so {', '.join(sorted(ddp_kwargs))} "
                             f"cannot apply; pass the plain model to exact_ddp, which wraps it")
        ddp = model
    else:
        if not group_ready():
            return model
        ddp = ddp_class(model, **ddp_kwargs)
    try:
        ddp.register_comm_hook(ddp.process_group, gradient_hook(gradient_sum, compression))
    except RuntimeError as e:
        raise ValueError("this DistributedDataParallel already has a communication hook, and DDP takes only one; "
                         "pass the plain model to exact_ddp, which wraps it") from e
    return ddp


def _check_ddp_kwargs(ddp_class, ddp_kwargs: dict) -> None:
    """Refuse an argument ``DistributedDataParallel`` does not take, also where no DDP is built (one process)."""
    params = inspect.signature(ddp_class.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k in params if k not in ("self", "module")]
    for key in sorted(ddp_kwargs):
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            fix = f"did you mean {close[0]}?" if close else f"it takes {', '.join(known)}"
            raise TypeError(f"exact_ddp passes its other arguments to DistributedDataParallel, which takes no "
                            f"argument {key!r}; {fix}")


def masked_mean(per_sample_loss, batch: dict, *, count=None):
    """This rank's share of the step's mean loss: its real samples' losses summed, over ``global_real_count``.

    The sum runs over the slots where ``mask > 0`` (the loader's mask is 1 for a real sample and
    0 for padding, so it is ``sum(mask * per_sample_loss)``; a fractional mask still counts a slot
    whole); the divisor is ``max(count, 1)``. Summed over ranks (which :func:`exact_ddp` does to
    the gradients) it is the mean over the step's real samples; padding slots count for
    nothing, even when their loss is NaN.

    Args:
        per_sample_loss: float tensor ``[slots]``, one loss per sample of this rank's batch
            (e.g. ``F.cross_entropy(logits, y, reduction="none")``).
        batch: the batch from :func:`evenflow.torch.plan_loader` (or a ``PlanLoader``); its
            ``mask`` and ``global_real_count`` are used.
        count: the denominator instead of ``batch["global_real_count"]``, e.g. the sum of the
            counts of K steps whose gradients are accumulated into one update (under ``no_sync``).

    Returns:
        a float32 scalar tensor on ``per_sample_loss``'s device (0 for a batch of padding only).

    Raises:
        TypeError: ``per_sample_loss`` or the mask is not a ``torch.Tensor``, or the count not one number.
        ValueError: ``per_sample_loss`` is not one number per slot of the batch (e.g. already
            reduced to a mean), ``batch`` is not an evenflow loader's (no ``mask`` or
            ``global_real_count``), or the count is not one finite number at least this rank's
            real samples (the step's count over all ranks includes them); the loss depends on a
            ``DistributedDataParallel`` with a communication hook that is not evenflow's.

    A plain ``DistributedDataParallel`` (DDP's averaging) that the loss depends on is made to sum
    its gradients, with a ``UserWarning``, before the backward pass
    (:mod:`evenflow.torch.ddp_watch`), so the update is exact with or without :func:`exact_ddp`.
    """
    torch = _torch()
    if not isinstance(batch, dict) or "mask" not in batch or (count is None and "global_real_count" not in batch):
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"masked_mean needs the batch of an evenflow loader (plan_loader or PlanLoader), which holds "
                         f"'mask' and 'global_real_count'; got {keys}")
    mask = batch["mask"]
    for name, value in (("per_sample_loss", per_sample_loss), ("batch['mask']", mask)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"masked_mean needs {name} as a torch.Tensor, got {type(value).__name__}; convert it "
                            f"with torch.as_tensor")
    if tuple(per_sample_loss.shape) != tuple(mask.shape):
        raise ValueError(f"masked_mean needs one loss per sample, shape {tuple(mask.shape)} like the batch's mask, got "
                         f"{tuple(per_sample_loss.shape)}; compute the loss with reduction='none' (and average each "
                         f"sample's own positions first)")
    total = batch["global_real_count"] if count is None else count
    _check_count("count" if count is not None else "batch['global_real_count']", total, mask)
    check_ddp(per_sample_loss)
    return masked_loss(per_sample_loss, mask.to(per_sample_loss.device), total)


def _check_count(name: str, total, mask) -> None:
    """Refuse a denominator that is not one finite number >= this rank's real slots (the mask's slots > 0).

    The values are checked where reading them costs no device sync: a count or mask on an
    accelerator is checked for its type and shape only.
    """
    torch = _torch()
    if isinstance(total, torch.Tensor) and total.dim() == 0 and not total.is_complex() and total.dtype != torch.bool:
        if total.device.type != "cpu":
            return
        value = total.item()
    elif isinstance(total, numbers.Real) and not isinstance(total, (bool, np.bool_)):
        value = total
    else:
        shown = f"a tensor of shape {tuple(total.shape)}" if isinstance(total, torch.Tensor) else repr(total)
        raise TypeError(f"masked_mean's {name} must be one real number (or a 0-d tensor), got {shown}")
    real = int((mask > 0).sum()) if mask.device.type == "cpu" else 0
    if not math.isfinite(value) or value < real:
        raise ValueError(f"masked_mean's {name} is the step's real samples over all ranks, so it must be a finite "
                         f"number >= this rank's {real} real samples, got {value!r}; pass the count the loader "
                         f"gives (or the sum of the accumulated steps' counts)")
