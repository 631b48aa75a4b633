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

from evenflow.torch._lazy import torch as _torch
from evenflow.torch.distributed import gradient_hook
from evenflow.torch.engine import COMPRESSIONS, GRADIENT_SUMS
from evenflow.torch.losses import masked_loss

__all__ = ["exact_ddp", "masked_mean"]



def exact_ddp(model, *, gradient_sum: str = "ring", compression: str = "none", **ddp_kwargs):
    """``model`` under ``DistributedDataParallel`` that SUMS gradients over ranks (see the module docstring).

    Use it where a plain DDP loop has ``DistributedDataParallel(model, ...)``, and compute the
    loss with :func:`masked_mean`.

    Args:
        model: a ``torch.nn.Module`` (already on its device), or a ``DistributedDataParallel``
            without a communication hook (then the hook is registered on it).
        gradient_sum: ``"ring"`` (DDP's own all-reduce, with SUM: the same traffic as plain DDP)
            or ``"ordered"`` (all-gather, then add in rank order: the same bits whatever DDP's
            bucket layout, so a resumed run is bitwise equal to an uninterrupted one; R buckets
            travel to every rank instead of about two).
        compression: ``"none"`` or ``"fp16"`` (gradients travel in float16, summed back in
            their own dtype).
        **ddp_kwargs: passed to ``DistributedDataParallel`` (``device_ids``,
            ``find_unused_parameters``, ``bucket_cap_mb``, ...).

    Returns:
        the ``DistributedDataParallel`` module when a process group is initialised (also for a
        world of 1); otherwise, in a plain ``python train.py`` without ``torchrun``, ``model``
        itself: one process has nothing to sum, so the same script runs unchanged, and
        ``ddp_kwargs`` (DDP's own arguments) have nothing to act on.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: an unknown ``gradient_sum`` or ``compression``, DDP arguments with a model
            that is already a ``DistributedDataParallel``, or one that already has a hook.
    """
    torch = _torch()
    if gradient_sum not in GRADIENT_SUMS:
        raise ValueError(f"gradient_sum must be one of {', '.join(GRADIENT_SUMS)}, got {gradient_sum!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    ddp_class = torch.nn.parallel.DistributedDataParallel
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"exact_ddp takes a torch.nn.Module (or a DistributedDataParallel), got {type(model).__name__}")
    if isinstance(model, ddp_class):
        if ddp_kwargs:
            raise ValueError(f"the model is already a DistributedDataParallel, so {', '.join(sorted(ddp_kwargs))} "
                             f"cannot apply; pass the plain model to exact_ddp, which wraps it")
        ddp = model
    else:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return model
        ddp = ddp_class(model, **ddp_kwargs)
    try:
        ddp.register_comm_hook(None, gradient_hook(gradient_sum, compression))
    except RuntimeError as e:
        raise ValueError("this DistributedDataParallel already has a communication hook, and DDP takes only one; "
                         "pass the plain model to exact_ddp, which wraps it") from e
    return ddp


def masked_mean(per_sample_loss, batch: dict, *, count=None):
    """This rank's share of the step's mean loss: ``sum(mask * per_sample_loss) / global_real_count``.

    Summed over ranks (which :func:`exact_ddp` does to the gradients) it is the mean over the
    step's real samples; padding slots count for nothing, even when their loss is NaN.

    Args:
        per_sample_loss: float tensor ``[slots]``, one loss per sample of this rank's batch
            (e.g. ``F.cross_entropy(logits, y, reduction="none")``).
        batch: the batch from :func:`evenflow.torch.plan_loader` (or a ``PlanLoader``); its
            ``mask`` and ``global_real_count`` are used.
        count: the denominator instead of ``batch["global_real_count"]``, e.g. the sum of the
            counts of K steps whose gradients are accumulated into one update (under ``no_sync``).

    Returns:
        a float32 scalar tensor on ``per_sample_loss``'s device.

    Raises:
        ValueError: ``per_sample_loss`` is not one number per slot of the batch (e.g. already
            reduced to a mean), or ``batch`` is not an evenflow loader's (no ``mask`` or
            ``global_real_count``).
    """
    torch = _torch()
    if not isinstance(batch, dict) or "mask" not in batch or (count is None and "global_real_count" not in batch):
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"masked_mean needs the batch of an evenflow loader (plan_loader or PlanLoader), which holds "
                         f"'mask' and 'global_real_count'; got {keys}")
    mask = batch["mask"]
    if not isinstance(per_sample_loss, torch.Tensor) or tuple(per_sample_loss.shape) != tuple(mask.shape):
        shape = tuple(per_sample_loss.shape) if hasattr(per_sample_loss, "shape") else type(per_sample_loss).__name__
        raise ValueError(f"masked_mean needs one loss per sample, shape {tuple(mask.shape)} like the batch's mask, got "
                         f"{shape}; compute the loss with reduction='none' (and average each sample's own "
                         f"positions first)")
    total = batch["global_real_count"] if count is None else count
    return masked_loss(per_sample_loss, mask.to(per_sample_loss.device), total)
