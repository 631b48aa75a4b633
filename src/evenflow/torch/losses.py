"""The masked loss that makes a padded, unevenly split step exactly the mean over its real samples.

Rank r computes ``sum(loss[j] for j with mask[j] > 0) / global_real_count`` (with the loader's
0/1 mask: ``sum_j(mask[j] * loss[j]) / global_real_count``); gradients are then
SUMMED over ranks (:data:`evenflow.torch.engine.GRADIENT_SUMS`), so the
applied gradient is that of ``sum(all real losses) / global_real_count``: the plain
mean over the step's real samples, whatever the number of ranks, their shares of
the step, or the padding. A rank with no real samples contributes zero.
"""
from __future__ import annotations

from evenflow.torch._lazy import torch as _torch


def per_sample_cross_entropy(logits, labels):
    """Softmax cross-entropy per sample, float32 ``[slots]``, from logits ``[slots, classes]`` and class ids ``[slots]``.

    Refuses (ValueError) labels that are not integer (or bool) class ids, one per sample — a float
    label would be truncated to a class — and, for labels on the CPU, an id outside
    ``0..classes-1`` (such as -1, the label of an unlabelled item). Labels on an accelerator are
    not range-checked: reading them would wait for the device every step.
    """
    torch = _torch()
    if not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or labels.dtype.is_complex:
        what = str(labels.dtype).replace("torch.", "") if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"per_sample_cross_entropy (the default loss_fn) needs integer class ids as labels, got "
                         f"{what} labels; pass the classes as integers 0..K-1, or pass your own loss_fn")
    if logits.dim() != 2 or tuple(labels.shape) != (logits.shape[0],):
        raise ValueError(f"per_sample_cross_entropy (the default loss_fn) needs logits [slots, classes] and one class "
                         f"id per sample, labels [slots]; got logits of shape {tuple(logits.shape)} and labels of "
                         f"shape {tuple(labels.shape)} (one-hot rows? pass their argmax); or pass your own loss_fn")
    classes = logits.shape[1]
    if labels.device.type == "cpu" and labels.numel() and not _within(labels, classes):
        bad = labels[(labels < 0) | (labels >= classes)]
        if bad.numel():
            raise ValueError(f"per_sample_cross_entropy (the default loss_fn) needs class ids in 0..{classes - 1} "
                             f"for logits of {classes} classes, got label {int(bad[0])}"
                             f"{' (an unlabelled item)' if int(bad[0]) == -1 else ''}; map the labels to "
                             f"0..{classes - 1}, or pass your own loss_fn")
    return torch.nn.functional.cross_entropy(logits.float(), labels.long(), reduction="none")


def _within(labels, classes: int) -> bool:
    """Whether every class id is in ``0..classes-1`` (one pass over the labels)."""
    low, high = _torch().aminmax(labels)
    return int(low) >= 0 and int(high) < classes


def masked_loss(per_sample, mask, global_real_count):
    """This rank's share of the step loss: ``sum(per_sample[mask > 0]) / max(global_real_count, 1)``.

    ``where`` rather than ``mask * loss``, so a padding slot holding a non-finite value
    cannot leak into the sum (``0 * nan`` is ``nan``).
    """
    return masked_sum(per_sample, mask) / loss_denominator(global_real_count, per_sample.device)


def masked_sum(per_sample, mask):
    """float32 ``sum(per_sample[mask > 0])``: the numerator of :func:`masked_loss` (and the step's loss sum)."""
    check_per_sample(per_sample, mask)
    return _torch().where(mask > 0, per_sample.float(), 0.0).sum()


def loss_denominator(global_real_count, device):
    """float32 ``max(global_real_count, 1)`` on ``device``: the denominator of :func:`masked_loss`.

    A number is written on the device by a fill kernel: a copy from the host would wait for the
    device's queued work (the previous update) before the step could start.
    """
    torch = _torch()
    if isinstance(global_real_count, torch.Tensor):
        return torch.clamp(global_real_count.to(device=device, dtype=torch.float32), min=1.0)
    return torch.full((), max(float(global_real_count), 1.0), dtype=torch.float32, device=device)


def check_per_sample(per_sample, mask) -> None:
    """Refuse a loss that is not one value per slot: a mean-reduced one would broadcast and count padding."""
    if per_sample.shape == mask.shape:
        return
    if per_sample.numel() == 1:  # reduced over the batch
        fix = "pass reduction='none', e.g. torch.nn.CrossEntropyLoss(reduction='none')"
    else:
        fix = "return one value per sample, shape [slots] (reduce each sample's own positions first)"
    raise ValueError(f"the loss must be one value per sample, shape {tuple(mask.shape)} like the mask, got shape "
                     f"{tuple(per_sample.shape)}; {fix}")
