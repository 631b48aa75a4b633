"""CPU cores for local workers: one core per worker, and a busy process that makes one core slow.

Local workers of :func:`~evenflow.tf.launch.local.launch` share the machine's cores, and the
kernel moves them between cores as it likes. Pinned (``--pin-cores``), worker i runs on the
i-th core this process may use (round-robin when there are more workers than cores), so two
workers on a 2-core machine are two truly parallel devices. A *busy process*
(``--slow-core C``) is a ``while True: pass`` loop pinned to core C: a worker pinned there gets
about half the core from then on — a real slowdown of every part of its step (compute,
collectives, input, Python), not an emulated sleep — which is how rebalancing is tried on one
machine.

Pinning happens in the child between ``fork`` and ``exec`` (``preexec_fn``), so the worker's
threads and children inherit the mask: pinning a started process by pid races with what it
starts meanwhile. Linux only (``os.sched_setaffinity``). Nothing here imports TensorFlow.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable

from evenflow.tf.launch.signals import stop_workers
from evenflow.util.validate import check_int, check_number

# In the busy process's program text, so a user (or a test) can find it in `ps`.
BUSY_MARKER = "evenflow-busy-core"


def usable_cores() -> list[int]:
    """The cores this process may run on, ascending; ValueError where affinity is not supported."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("pinning workers to cores needs os.sched_setaffinity (Linux); drop --pin-cores and "
                         "--slow-core on this platform")
    return sorted(os.sched_getaffinity(0))


def worker_cores(workers: int) -> list[int]:
    """The core of each of ``workers`` workers: the usable cores in order, round-robin."""
    cores = usable_cores()
    return [cores[i % len(cores)] for i in range(workers)]


def pin_to(core: int) -> Callable[[], None]:
    """A ``preexec_fn`` that pins the child (and so its future threads and children) to ``core``."""
    return lambda: os.sched_setaffinity(0, {core})


def check_core(core: int, flag: str) -> None:
    """ValueError unless ``core`` is one this process may run on (``flag`` names the option)."""
    cores = usable_cores()
    if core not in cores:
        raise ValueError(f"{flag} {core}: this process may run on cores {', '.join(map(str, cores))} only; "
                         f"choose one of them")


def check_slow(core: int | None, after: float) -> None:
    """ValueError unless ``core`` (or None) and ``after`` are a valid busy-core request."""
    if core is not None:
        check_int("slow_core", core, 0, fix="a core number")
    check_number("slow_after", after, 0, fix="seconds")
    if after > 0 and core is None:
        raise ValueError(f"slow_after ({after:g} s) delays the busy process of slow_core, which is not set; "
                         f"give --slow-core CORE too, or drop --slow-after")


class BusyCore:
    """A CPU-bound process pinned to one core, from ``after`` seconds on, until :meth:`stop`.

    Args:
        core: the core to keep busy (one this process may run on).
        after: seconds to wait before busying it, >= 0 (a slowdown that starts mid-run).
    """

    def __init__(self, core: int, after: float = 0.0):
        check_core(core, "--slow-core")
        self.core, self.after = int(core), float(after)
        program = (f"# {BUSY_MARKER}\nimport time\ntime.sleep({self.after!r})\n"
                   "while True:\n    pass\n")
        self.proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=pin_to(self.core), start_new_session=True)

    def stop(self) -> None:
        """End the busy process (SIGKILL: it has nothing to save)."""
        stop_workers([self.proc], 0.0)
