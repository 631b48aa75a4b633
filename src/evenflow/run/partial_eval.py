"""Evaluation counts every sample its plan reads; a plan that drops the remainder reads fewer than its index holds.

``Plan(..., drop_remainder=True)`` leaves out the samples past the last full global batch of each
epoch (``N mod G`` of them): right for training, where every step is then full, but evaluation
over such a plan is exact over fewer samples than the test set. :func:`warn_if_partial` says so.
"""
from __future__ import annotations

import warnings


def warn_if_partial(plan) -> None:
    """Warn (``UserWarning``) when ``plan`` reads fewer samples per epoch than its index holds."""
    options = plan.options
    if not options.drop_remainder or options.pack:  # a packed plan's steps count packs, not samples
        return
    read, total = int(plan.step_sizes.sum()), int(plan.index.num_samples)
    if read < total:
        warnings.warn(f"evaluation counts {read} of the {total} samples of its plan: the plan drops the "
                      f"{total - read} past the last full global batch of {options.global_batch_size} "
                      f"(drop_remainder=True); plan the test set with drop_remainder=False to count every sample",
                      UserWarning, stacklevel=3)
