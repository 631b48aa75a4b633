"""The masked loss that makes a padded, unevenly split step exactly the mean over its real samples.

Rank r computes ``sum(loss[j] for j with mask[j] > 0) / global_real_count`` (with the loader's
0/1 mask: ``sum_j(mask[j] * loss[j]) / global_real_count``); gradients are then
SUMMED over ranks (:data:`evenflow.torch.trainer.GRADIENT_SUMS`), so the
applied gradient is that of ``sum(all real losses) / global_real_count``: the plain
mean over the step's real samples, whatever the number of ranks, their shares of
the step, or the padding. A rank with no real samples contributes zero.
"""
from __future__ import annotations

from evenflow.torch._lazy import torch as _torch

__all__ = ["check_per_sample", "masked_loss", "per_sample_cross_entropy"]


def per_sample_cross_entropy(logits, labels):
    """Softmax cross-entropy per sample, float32 ``[slots]``, from logits and integer labels."""
    torch = _torch()
    return torch.nn.functional.cross_entropy(logits.float(), labels.long(), reduction="none")


def masked_loss(per_sample, mask, global_real_count):
    """This rank's share of the step loss: ``sum(per_sample[mask > 0]) / max(global_real_count, 1)``.

    ``where`` rather than ``mask * loss``, so a padding slot holding a non-finite value
    cannot leak into the sum (``0 * nan`` is ``nan``).
    """
    torch = _torch()
    check_per_sample(per_sample, mask)
    per_sample = per_sample.float()
    masked = torch.where(mask > 0, per_sample, torch.zeros_like(per_sample))
    denom = torch.clamp(torch.as_tensor(global_real_count, dtype=torch.float32, device=per_sample.device), min=1.0)
    return masked.sum() / denom


def check_per_sample(per_sample, mask) -> None:
    """Refuse a loss that is not one value per slot: a mean-reduced one would broadcast and count padding."""
    if per_sample.shape != mask.shape:
        raise ValueError(f"the loss must be one value per sample, shape {tuple(mask.shape)} like the mask, got shape "
                         f"{tuple(per_sample.shape)}; pass reduction='none', e.g. "
                         f"torch.nn.CrossEntropyLoss(reduction='none')")
