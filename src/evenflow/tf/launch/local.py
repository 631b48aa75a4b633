"""Start N local worker processes of one command, as a TensorFlow multi-worker cluster on 127.0.0.1.

Each worker is the same command with its own ``TF_CONFIG`` (the cluster's free
``127.0.0.1`` ports and its index), so :func:`~evenflow.tf.launch.cluster.cluster_from_env`
and MultiWorkerMirroredStrategy see an ordinary cluster: TensorFlow's own runtime
connects the workers, nothing here carries data between them.

The launcher's job is the lifecycle:

* every output line of worker i is printed with the prefix ``[worker i]`` (stdout
  to stdout, stderr to stderr), whole lines only, so workers never interleave
  mid-line;
* the first worker to fail decides the exit code (a worker killed by signal S
  counts as ``128 + S``, as in a shell), and the others are stopped: SIGTERM,
  then SIGKILL after a grace period — MultiWorkerMirroredStrategy catches
  SIGTERM, so SIGKILL is what actually ends a worker stuck in a collective;
* Ctrl-C (or SIGTERM to the launcher) stops every worker the same way.

Each worker runs in its own process group, which is what gets signalled, so
anything a worker started goes with it (:mod:`evenflow.tf.launch.signals`).
Nothing here imports TensorFlow.
"""
from __future__ import annotations

import functools
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from evenflow.tf.launch.cluster import tf_config
from evenflow.tf.launch.cores import BusyCore, check_core, check_slow, pin_to, usable_cores, worker_cores
from evenflow.tf.launch.io import Pump, free_ports, say_line, worker_env
from evenflow.tf.launch.signals import Interrupts, describe_exit, exit_code, stop_workers
from evenflow.util.validate import check_int, check_number, set_checked

# Local workers share the machine's cores; a typo like --workers 1000 should not fork 1000 TensorFlows.
MAX_WORKERS = 64


@dataclass(frozen=True)
class LaunchOptions:
    """How :func:`launch` runs its workers.

    Attributes:
        workers: number of worker processes N, in ``[1, 64]``.
        replicas_per_worker: replicas each worker runs (exported as
            ``EVENFLOW_REPLICAS_PER_WORKER``, which ``evenflow train`` uses instead of
            its ``replicas``); None leaves it to the command.
        grace_seconds: how long stopped workers get between SIGTERM and SIGKILL, >= 0.
        host: the address the workers listen on.
        private_network: run the workers in a network namespace of their own (Linux; see
            :mod:`evenflow.tf.launch.private_network`), so their TensorFlow ports are not reachable from
            the machine's network; where the machine allows none, they run on its network and a
            line says so.
        pin_cores: pin worker i to the i-th core this process may use (round-robin), so local
            workers are truly parallel devices (Linux; see :mod:`evenflow.tf.launch.cores`).
        slow_core: keep this core busy with a CPU-bound process while the workers run (a real
            slowdown of the worker pinned there), or None.
        slow_after: seconds after the start at which the busy process begins, >= 0; needs
            ``slow_core``.
        ps: parameter servers, in ``[0, 64]``; with any, the command runs as the chief, the
            workers and the servers of a parameter-server cluster (:mod:`evenflow.tf.ps.launcher`).
    """

    workers: int
    replicas_per_worker: int | None = None
    grace_seconds: float = 10.0
    host: str = "127.0.0.1"
    private_network: bool = False
    pin_cores: bool = False
    slow_core: int | None = None
    slow_after: float = 0.0
    ps: int = 0

    def __post_init__(self):
        set_checked(self, "workers", check_int, 1, MAX_WORKERS)
        if self.replicas_per_worker is not None:
            set_checked(self, "replicas_per_worker", check_int, 1)
        set_checked(self, "grace_seconds", check_number, 0)
        check_slow(self.slow_core, self.slow_after)
        set_checked(self, "ps", check_int, 0, MAX_WORKERS, fix="parameter servers")


def launch(command: Sequence[str], options: LaunchOptions, out=None, err=None, env=None) -> int:
    """Run ``command`` as ``options.workers`` local workers of one cluster; return the exit code.

    Args:
        command: the program and its arguments, e.g. ``["evenflow", "train", "--epochs", "3"]``.
        options: a :class:`LaunchOptions`.
        out, err: where the workers' prefixed stdout and stderr lines go (default ours).
        env: the workers' base environment (default ``os.environ``).

    Returns:
        0 if every worker exited 0; else the exit code of the first worker that failed
        (``128 + S`` for a worker killed by signal S); 130 after Ctrl-C.

    Raises:
        ValueError: an empty command, a program that cannot be found, or a ``slow_core`` this
            process may not run on.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    command = _checked_command(command)
    if options.slow_core is not None:
        check_core(options.slow_core, "--slow-core")
    if options.pin_cores:
        usable_cores()  # a platform without CPU affinity says so now
    from evenflow.tf.ps.launcher import run_ps

    runner = run_ps if options.ps else _run
    if options.private_network:
        from evenflow.tf.launch.private_network import run_in_private_network

        code, why_not = run_in_private_network(lambda: runner(command, options, out, err, env, "a private network"))
        if why_not is None:
            return code
        err.write(f"evenflow launch: note: the workers run on this machine's network, where TensorFlow's ports listen "
                  f"on every interface without authentication ({why_not}); keep the machine on a private network\n")
    return runner(command, options, out, err, env, "this machine's network")


def _run(command: list[str], options: LaunchOptions, out, err, env, network: str) -> int:
    """Start, supervise and stop the workers; the launch's exit code."""
    addresses = [f"{options.host}:{p}" for p in free_ports(options.workers, options.host)]
    base = worker_env(options, env)
    lock = threading.Lock()
    say = functools.partial(say_line, err, lock)
    say(f"{options.workers} worker(s) on {', '.join(addresses)} ({network}): {shlex.join(command)}")
    cores = worker_cores(options.workers) if options.pin_cores else None
    if cores is not None:
        say("pinned: " + ", ".join(f"worker {i} on core {c}" for i, c in enumerate(cores)))
    busy = None if options.slow_core is None else BusyCore(options.slow_core, options.slow_after)
    if busy is not None:
        say(f"a busy process (pid {busy.proc.pid}) keeps core {busy.core} busy"
            + (f" from {busy.after:g} s on" if busy.after else "") + " until the workers end")
    try:
        procs, pumps = _start_workers(command, addresses, base, out, err, lock, cores)
    except BaseException:
        if busy is not None:
            busy.stop()
        raise
    interrupted = Interrupts()
    try:
        failure = _supervise(procs, options.grace_seconds, interrupted, say)
    finally:
        interrupted.restore()
        stop_workers(procs, 0.0)  # nothing outlives the launcher
        if busy is not None:
            busy.stop()
        for pump in pumps:
            pump.join(timeout=5)
    return _exit_status(procs, failure, interrupted.signum, say)


def _checked_command(command: Sequence[str]) -> list[str]:
    """``command`` as strings; ValueError when it is empty or its program cannot be found."""
    command = [str(c) for c in command]
    if not command:
        raise ValueError("a command to run is required after --, e.g. evenflow launch --workers 2 -- evenflow train "
                         "--dataset builtin:digits")
    if shutil.which(command[0]) is None:
        raise ValueError(f"command {command[0]!r} was not found (not an executable file, nor on PATH); "
                         f"check the spelling or give its full path")
    return command


def _start_workers(command: list[str], addresses: list[str], base: dict[str, str], out, err,
                   lock: threading.Lock, cores: list[int] | None = None
                   ) -> tuple[list[subprocess.Popen], list[Pump]]:
    """Start one worker per address, each in its own session (pinned to ``cores[i]`` when given),
    with a pump for each of its output streams."""
    procs: list[subprocess.Popen] = []
    pumps: list[Pump] = []
    for i in range(len(addresses)):
        worker_env = dict(base, TF_CONFIG=tf_config(addresses, i))
        proc = subprocess.Popen(command, env=worker_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=None if cores is None else pin_to(cores[i]))
        procs.append(proc)
        for stream, target in ((proc.stdout, out), (proc.stderr, err)):
            pump = Pump(stream, f"[worker {i}] ", target, lock)
            pump.start()
            pumps.append(pump)
    return procs, pumps


def _supervise(procs: list[subprocess.Popen], grace: float, interrupted: Interrupts,
               say: Callable[[str], None]) -> tuple[int, int] | None:
    """Wait until every worker has exited or the launcher is interrupted, stopping the rest after a failure.

    Returns:
        ``(worker, returncode)`` of the first worker that failed, else None.
    """
    failure: tuple[int, int] | None = None
    while True:
        codes = [p.poll() for p in procs]
        if failure is None:
            failure = _first_failure(codes)
            if failure is not None:
                _stop_after_failure(procs, codes, failure, grace, say)
        if interrupted.signum is not None:
            say(f"received {signal.Signals(interrupted.signum).name}; stopping the workers")
            stop_workers(procs, grace)
            break
        if all(c is not None for c in codes):
            break
        time.sleep(0.05)
    return failure


def _first_failure(codes: list[int | None]) -> tuple[int, int] | None:
    """``(worker, returncode)`` of the lowest-numbered worker that exited non-zero, else None."""
    return next(((i, rc) for i, rc in enumerate(codes) if rc not in (None, 0)), None)


def _stop_after_failure(procs: list[subprocess.Popen], codes: list[int | None], failure: tuple[int, int],
                        grace: float, say: Callable[[str], None]) -> None:
    """Say which worker failed and how, then stop the workers still running."""
    i, rc = failure
    running = sum(c is None for c in codes)
    say(f"worker {i} {describe_exit(rc)}" + (
        f"; stopping the other {running} worker(s) (SIGTERM, then SIGKILL after "
        f"{grace:g} s)" if running else ""))
    stop_workers(procs, grace)


def _exit_status(procs: list[subprocess.Popen], failure: tuple[int, int] | None, signum: int | None,
                 say: Callable[[str], None]) -> int:
    """The launcher's exit code: 128 + S after signal S, else the first failure's, else 0.

    After a failure, also says how each other worker that did not exit 0 ended.
    """
    if signum is not None:
        return 128 + signum
    if failure is not None:
        for i, p in enumerate(procs):
            if i != failure[0] and p.returncode not in (0, None):
                say(f"worker {i} {describe_exit(p.returncode)}")
        return exit_code(failure[1])
    return 0
