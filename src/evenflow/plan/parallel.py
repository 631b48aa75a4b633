"""Threads for planning: numpy releases the GIL in its loops, so large array work splits across cores."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_range(fn: Callable[[int, int], None], lo: int, hi: int, parts: int) -> None:
    """Call ``fn(a, b)`` on ``parts`` contiguous pieces of ``[lo, hi)``, one thread each when more than one.

    ``fn`` writes its piece's results itself, so the pieces must not share output.
    """
    parts = max(1, min(parts, hi - lo))
    if parts == 1:
        fn(lo, hi)
        return
    cuts = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
    with ThreadPoolExecutor(parts) as pool:
        list(pool.map(fn, cuts[:-1], cuts[1:]))  # list(): re-raises the first error
