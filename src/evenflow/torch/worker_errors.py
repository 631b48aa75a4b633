"""What a ``DataLoader`` worker process's failure looks like in the process that consumes its batches.

**A worker that dies.** When a worker process dies without an error it could send back (killed
by a signal: the kernel's out-of-memory killer sends SIGKILL; or ended by a crash or ``os._exit``),
torch raises a ``RuntimeError`` in the consuming process, in one of these forms:

* from its SIGCHLD handler, at whatever line the main thread is running (the training step, a
  checkpoint save, your own loop): ``DataLoader worker (pid N) is killed by signal: Killed.`` or
  ``DataLoader worker (pid N) exited unexpectedly with exit code C. ...``;
* from the loader's own check while it waits for a batch:
  ``DataLoader worker (pid(s) N, M) exited unexpectedly``;
* ``Pin memory thread exited unexpectedly`` (``pin_memory=True``);
* a lost connection (``ConnectionResetError``, ``EOFError``) when the worker dies while the
  consuming process receives a batch's shared memory from it (:func:`exited_worker` then names it).

:func:`worker_death` reads one of these as a :class:`WorkerDeath` (pids, signal, exit code), and
:func:`worker_died` makes the :class:`LoaderWorkerDied` error that names the worker, the rank, where
the rank stopped, the likely causes and what to do. :func:`watched` is a ``PlanLoader``'s iterator:
it raises that error for a worker that dies while the rank waits for a batch.

**A worker that raises.** A Python exception in a worker (in a dataset's ``__getitem__``, a
source's ``batch`` or a transform) does not kill it: torch re-raises the exception's type in the
consuming process with the worker's traceback, which holds evenflow's note of the sample ids it
was reading (:func:`evenflow.util.read_errors.note_samples`); a bad record's ``RecordError`` comes
back as a ``RuntimeError``, which :func:`worker_record_error` turns back into it.
"""
from __future__ import annotations

import re
import signal as _signal
import time
from dataclasses import dataclass
from typing import Callable, Iterator

# How to load with fewer workers, and in the training process itself: as a command-line flag, as an argument.
CLI_FLAGS = ("lower --loader-workers", "--loader-workers 0")
API_ARGS = ("use fewer num_workers", "num_workers=0")

_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.*?)\.(?:\s|$)")
_EXITED = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_GONE = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_PIN = "Pin memory thread exited unexpectedly"
_CRASHES = ("SIGSEGV", "SIGABRT", "SIGILL", "SIGFPE")


class LoaderWorkerDied(RuntimeError):
    """A ``DataLoader`` worker process of this rank died, so this rank's batches stopped.

    Attributes:
        death: the :class:`WorkerDeath` (pids, signal, exit code).
        rank: the rank whose worker it was.
        epoch, step: the step the rank was at (the next one it needed), or None where unknown.
    """

    def __init__(self, message: str, death: "WorkerDeath | None" = None, rank: int | None = None,
                 epoch: int | None = None, step: int | None = None):
        super().__init__(message)
        self.death, self.rank, self.epoch, self.step = death, rank, epoch, step


@dataclass(frozen=True)
class WorkerDeath:
    """How a loader worker died: its pid(s) (none for the pin-memory thread), the signal or the exit code."""

    pids: tuple[int, ...]
    signal: int | None = None
    exit_code: int | None = None

    def who(self) -> str:
        if not self.pids:
            return "the DataLoader's pin-memory thread"
        return f"DataLoader worker (pid{'s' if len(self.pids) > 1 else ''} {', '.join(map(str, self.pids))})"

    def how(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal}, {_signal_name(self.signal)}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return "stopped" if not self.pids else "exited unexpectedly"

    def causes(self, flags: tuple[str, str]) -> str:
        """The likely causes and what to do, with the loader options ``flags`` (:data:`CLI_FLAGS`, :data:`API_ARGS`)."""
        fewer, none = flags
        here = f"{none} loads in the training process and shows the error"
        name = _signal_name(self.signal) if self.signal is not None else ""
        if name == "SIGKILL":
            return (f"likely out of memory (the kernel's out-of-memory killer sends SIGKILL; see `dmesg`): {fewer}, "
                    f"or give the job more memory")
        if name == "SIGBUS":
            return f"likely out of shared memory (/dev/shm, which carries the batches): raise its size or {fewer}"
        if name in _CRASHES:
            return f"a crash in native code of the data loading (a C extension the data code uses); {here}"
        if self.signal is not None:
            return "it was stopped from outside the job"
        if not self.pids:
            return "it failed while copying a batch to page-locked memory; load without pin_memory to see why"
        if self.exit_code is not None:
            return (f"the worker exited without an error it could send back (os._exit or sys.exit in the data code, "
                    f"such as a Dataset's __getitem__, or a native crash); {here}")
        return (f"likely out of memory ({fewer}) or a crash in the data code, such as a Dataset's __getitem__ "
                f"({here})")


def worker_death(error: BaseException, exit_codes: dict | None = None) -> WorkerDeath | None:
    """The :class:`WorkerDeath` torch's ``error`` reports, or None for any other error.

    torch's SIGCHLD handler raises wherever the main thread is, so code that turns errors into its
    own (a checkpoint write's "could not be written") may hold it as the cause or context: the
    chain of causes is read too.

    Args:
        error: what the consuming process caught.
        exit_codes: ``{pid: exitcode}`` of the loader's worker processes where known (a negative
            exit code is the signal that ended it).
    """
    seen = []
    while error is not None and len(seen) < 8:  # the error, or what it was raised while handling
        death = _death(error, exit_codes)
        if death is not None:
            return death
        seen.append(error)
        error = error.__cause__ or error.__context__
        if any(error is e for e in seen):
            break
    return None


def _death(error: BaseException, exit_codes: dict | None) -> WorkerDeath | None:
    if isinstance(error, LoaderWorkerDied):
        return error.death
    if not isinstance(error, RuntimeError):
        return None
    text = str(error).strip()
    m = _KILLED.match(text)
    if m:
        return WorkerDeath((int(m.group(1)),), signal=_signal_number(m.group(2)))
    m = _EXITED.match(text)
    if m:
        return WorkerDeath((int(m.group(1)),), exit_code=int(m.group(2)))
    m = _GONE.match(text)
    if m:
        pids = tuple(int(p) for p in m.group(1).replace(" ", "").split(",") if p)
        codes = [(exit_codes or {}).get(p) for p in pids]
        if len(pids) == 1 and codes[0] is not None:
            return WorkerDeath(pids, signal=-codes[0] if codes[0] < 0 else None,
                               exit_code=codes[0] if codes[0] >= 0 else None)
        return WorkerDeath(pids)
    if text.startswith(_PIN):
        return WorkerDeath(())
    return None


def worker_died(death: WorkerDeath, rank: int, where: tuple[int, int] | None, then: str,
                flags: tuple[str, str]) -> LoaderWorkerDied:
    """The one-line error: ``<worker> of rank R died (<how>); rank R stopped at epoch E step S. <then>. <causes>``.

    Args:
        death: how the worker died.
        rank: its rank.
        where: ``(epoch, step)`` the rank was at (the next step it needed), or None.
        then: what to do now, a sentence (e.g. "Run the same command again to resume from ...").
        flags: :data:`CLI_FLAGS` or :data:`API_ARGS`, for the causes' advice.
    """
    stopped = f"; rank {rank} stopped at epoch {where[0]} step {where[1]}" if where is not None else ""
    died = "stopped" if not death.pids else f"died ({death.how()})"
    then = f" {then.rstrip('.')}." if then else ""
    message = f"{death.who()} of rank {rank} {died}{stopped}.{then} Cause: {death.causes(flags)}"
    return LoaderWorkerDied(message, death, rank, *(where if where is not None else (None, None)))


def watched(batches: Iterator, finish: Callable, rank: int, first: int, num_steps: int):
    """``finish(batch)`` for each batch of the ``DataLoader`` iterator ``batches``, which reads global steps
    ``first, first + 1, ...`` of a plan of ``num_steps`` steps per epoch for ``rank``.

    A worker process that dies while the rank waits for a batch raises :class:`LoaderWorkerDied`
    (the step is the one it waited for). Closing this generator (or its end) shuts the workers
    down at once, not when ``batches`` is collected.
    """
    done = 0
    try:
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (RuntimeError, ConnectionError, EOFError) as e:
                workers = getattr(batches, "_workers", ())
                death = (worker_death(e, {w.pid: w.exitcode for w in workers}) if isinstance(e, RuntimeError)
                         else exited_worker(workers))
                if death is None:
                    raise
                where = divmod(first + done, num_steps) if num_steps else None
                raise worker_died(death, rank, where, "", API_ARGS) from None
            done += 1
            yield finish(batch)
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def exited_worker(workers, wait: float = 5.0) -> WorkerDeath | None:
    """The first of ``workers`` (``multiprocessing`` processes) that has exited, waiting up to ``wait`` seconds
    for one to, as a :class:`WorkerDeath`; None if all are alive.

    A worker that dies while the consuming process receives a batch from it (a tensor's storage is
    handed over through a connection to the worker) surfaces as a lost connection, before torch's
    own check of its workers has run.
    """
    deadline = time.monotonic() + wait
    while True:
        for w in workers:
            code = w.exitcode
            if code is not None:
                return WorkerDeath((w.pid,), signal=-code if code < 0 else None, exit_code=code if code >= 0 else None)
        if time.monotonic() >= deadline or not workers:
            return None
        time.sleep(0.05)


def worker_record_error(error: BaseException):
    """The :class:`~evenflow.records.RecordError` a DataLoader worker process raised, or None.

    torch re-raises an exception from a worker in the main process by calling its class
    with one message that holds the worker's traceback; ``RecordError`` takes keyword
    location fields, so torch falls back to a ``RuntimeError`` of that text. Its last
    ``RecordError:`` line is the one-line message (file, record number, byte offset, fix).
    """
    from evenflow.records import RecordError
    text = str(error)
    if not text.startswith("Caught RecordError"):
        return None
    lines = [ln for ln in text.strip().splitlines() if "RecordError: " in ln]
    if not lines:
        return None
    return RecordError(None, lines[-1].split("RecordError: ", 1)[1].strip())


def _signal_number(text: str) -> int | None:
    """The signal whose description (``strsignal``, e.g. "Killed") is ``text``, or None."""
    text = text.strip().rstrip(".")
    for sig in _signal.Signals:
        if _signal.strsignal(sig) == text or sig.name == text:
            return int(sig)
    return None


def _signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
