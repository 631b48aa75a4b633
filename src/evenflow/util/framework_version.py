"""The oldest TensorFlow and PyTorch evenflow supports, and the check each adapter makes on import.

The framework extras in ``pyproject.toml`` declare the same lower bounds (``tensorflow>=2.16,<3``,
``torch>=2.8``); they keep whatever build the user installed (GPU, CPU, nightly), so a build that
pip did not choose is checked here, on first use, with the fix in one line (docs/install.md).
"""
from __future__ import annotations

import re

# TensorFlow 2.16 is the first whose `keras` is Keras 3, the Keras evenflow.tf calls.
OLDEST_TENSORFLOW = (2, 16)
# PyTorch 2.8 has everything evenflow.torch calls: fully_shard in torch.distributed.fsdp and the
# safetensors storage of torch.distributed.checkpoint (sharded checkpoints).
OLDEST_TORCH = (2, 8)


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: ``"2.13.0+cpu"`` -> ``(2, 13, 0)``, ``"2.21.0rc1"`` -> ``(2, 21, 0)``."""
    numbers = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def too_old(what: str, version: str, oldest: tuple[int, ...], fix: str) -> str | None:
    """The one-line refusal of ``what`` at ``version`` when it is older than ``oldest``, else None.

    A version string without leading numbers (a local build) is let through: it cannot be compared.
    """
    got = release(version)
    if not got or got[:len(oldest)] >= oldest:
        return None
    shown = ".".join(map(str, oldest))
    return f"evenflow needs {what} {shown} or later, and this environment has {what} {version}; run {fix}"
