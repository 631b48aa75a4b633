"""Whether an epoch plan fits in this machine's memory, before a permutation of N samples is allocated.

Planning an epoch materialises its ids: about :data:`BYTES_PER_SAMPLE` bytes per sample at
the peak (the permutation, the step layout and the output, measured by
``benchmarks/plan_speed.py``: 18 to 27 at 10^7 samples). A window of steps needs that per
sample of the window. A request that cannot fit fails with one line saying how much it needs,
instead of growing until the operating system kills the process.
"""
from __future__ import annotations

import os

BYTES_PER_SAMPLE = 28


class PlanTooLarge(ValueError):
    """A plan that cannot fit in memory. ``problem`` says how much it needs and what the machine has,
    and ``what`` ("an epoch of" or "a window of") lets a caller give its own way out after it."""

    def __init__(self, problem: str, hint: str, what: str):
        super().__init__(f"{problem}; {hint}")
        self.problem, self.what = problem, what


def _physical_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):  # not POSIX: no limit known
        return None


def check_epoch_fits(num_samples: int, fraction: float = 0.8, what: str = "an epoch of") -> None:
    """Raise :class:`PlanTooLarge` (a ``ValueError``) when planning ``num_samples`` needs more than
    ``fraction`` of the memory."""
    total = _physical_bytes()
    need = int(num_samples) * BYTES_PER_SAMPLE
    if total is not None and need > fraction * total:
        hint = ("ask for fewer steps at a time (plan.epoch(e, start, stop))" if what == "a window of" else
                "plan a window of steps at a time (plan.epoch(e, start, stop), plan.replica_ids) or fewer samples")
        raise PlanTooLarge(f"planning {what} {num_samples:,} samples needs about {need / 2**30:,.1f} GiB "
                           f"({BYTES_PER_SAMPLE} bytes per sample) and this machine has {total / 2**30:,.1f} GiB",
                           hint, what)
