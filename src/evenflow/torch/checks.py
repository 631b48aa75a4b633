"""What the trainer and the loader check in the user's code and arguments, each refusal one line naming the fix.

* :func:`logits_of`: the trainer's model returns one tensor of logits ``[slots, classes]``
  (a tuple or dict is refused right after the forward pass, before the loss and backward).
* :func:`class_hits`: accuracy counts hits for integer class ids ``[slots]`` and logits
  ``[slots, classes >= 2]`` only; other labels or outputs count 0 (never a broadcast).
* :func:`checked_transform`: a loader ``transform`` returns the batch dict with the keys
  evenflow reads and every row it was given (one per slot: the plan counts each sample).
* :func:`loader_options`: ``PlanLoader``'s worker, prefetch and memory options.
* :func:`check_precision`: the trainer runs in ``float32`` or ``mixed_bfloat16``.
"""
from __future__ import annotations

from evenflow.torch._lazy import torch as _torch
from evenflow.util.validate import check_bool, check_int

# The keys of a batch that evenflow reads after a transform (the loader, then the trainer).
READ_KEYS = ("id", "mask", "global_real_count", "epoch", "step", "features", "label")
ROW_KEYS = ("id", "mask", "features", "label")


def logits_of(out):
    """The model's output if it is one tensor; TypeError for a tuple, list, dict or anything else."""
    if isinstance(out, _torch().Tensor):
        return out
    what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (list, tuple, dict)) else type(out).__name__
    raise TypeError(f"the trainer's model must return one tensor of logits [slots, classes], got {what}; for several "
                    f"outputs combine them in the model, or train in your own loop with exact_ddp and masked_mean")


def class_hits(logits, labels, real):
    """Real slots whose top logit is the label (a 0-d tensor, not read on the host), for integer (or bool)
    class ids ``[slots]`` and logits ``[slots, classes >= 2]``; 0.0 for anything else (float targets,
    one-hot rows, one logit)."""
    dtype = labels.dtype
    ids = not dtype.is_floating_point and not dtype.is_complex and tuple(labels.shape) == tuple(real.shape)
    if not (ids and logits.dim() == 2 and logits.shape[0] == real.shape[0] and logits.shape[1] >= 2):
        return 0.0
    return ((logits.argmax(dim=-1) == labels) & real).sum()


def _rows(value) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    return len(value) if isinstance(value, (list, tuple)) else None


def checked_transform(transform, batch: dict) -> dict:
    """``transform(batch)``, refused unless it is a dict that keeps :data:`READ_KEYS` and every row."""
    given = [k for k in READ_KEYS if k in batch]
    rows = {k: _rows(batch[k]) for k in ROW_KEYS if k in batch and _rows(batch[k]) is not None}
    out = transform(batch)
    if not isinstance(out, dict):
        raise TypeError(f"transform must return the batch dict it was given (changed), got {type(out).__name__}; "
                        f"end it with 'return batch'")
    missing = [k for k in given if k not in out]
    if missing:
        raise ValueError(f"transform dropped the key(s) {missing} that evenflow reads; return the batch with them "
                         f"(change their values, not their names)")
    changed = [f"{k} from {n} to {_rows(out[k])}" for k, n in rows.items() if _rows(out[k]) != n]
    if changed:
        raise ValueError(f"transform changed the number of rows ({', '.join(changed)}); it must keep every row, one "
                         f"per slot, as the plan counts each sample: to leave samples out, plan over a SubsetSource "
                         f"of the ones to keep")
    return out


def loader_options(num_workers, prefetch_factor, multiprocessing_context, pin_memory, transform) -> tuple[int, int]:
    """``(num_workers, prefetch_factor)`` as ints once checked (numpy integers taken); errors name the argument."""
    num_workers = check_int("num_workers", num_workers, 0)
    for name, value in (("prefetch_factor", prefetch_factor), ("multiprocessing_context", multiprocessing_context)):
        if value is not None and num_workers == 0:
            raise ValueError(f"{name}={value!r} applies to DataLoader worker processes, and num_workers is 0 "
                             f"(batches load in this process); pass num_workers >= 1 or leave {name} out")
    if prefetch_factor is not None:
        prefetch_factor = check_int("prefetch_factor", prefetch_factor, 1)
    check_bool("pin_memory", pin_memory)
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be a function batch -> batch, got {type(transform).__name__}")
    return num_workers, prefetch_factor


def check_precision(precision: str) -> None:
    """Refuse a precision PyTorch's engine does not run, naming the two it does."""
    if precision not in ("float32", "mixed_bfloat16"):
        raise ValueError(f"precision must be float32 or mixed_bfloat16 with PyTorch, got {precision!r}")
