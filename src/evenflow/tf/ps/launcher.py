"""``evenflow launch --ps M``: one command as the chief, the workers and the parameter servers of one cluster.

The same command runs in every task with its own ``TF_CONFIG`` (cluster of 1 chief, N workers
and M parameter servers on free 127.0.0.1 ports); ``evenflow train --strategy ps`` trains in
the chief and serves in the others. Output lines are prefixed ``[chief]``, ``[worker i]`` or
``[ps j]``. The chief decides: the launch ends when it does, with its exit code, and the
servers are stopped then (SIGTERM, SIGKILL after the grace period). A worker that ends early
is reported and the run goes on (the chief gives its steps to the others); a parameter server
that ends early is reported too, and the chief's next step that needs it fails. Nothing here
imports TensorFlow.
"""
from __future__ import annotations

import functools
import shlex
import signal
import subprocess
import threading
import time

from evenflow.tf.launch.cores import BusyCore, pin_to, worker_cores
from evenflow.tf.launch.io import Pump, free_ports, say_line, worker_env
from evenflow.tf.ps.cluster import ps_tf_config
from evenflow.tf.launch.signals import Interrupts, describe_exit, exit_code, stop_workers


def run_ps(command: list[str], options, out, err, env, network: str) -> int:
    """Start the cluster's tasks, wait for the chief, stop the servers; the chief's exit code."""
    kinds = [("chief", 0)] + [("worker", i) for i in range(options.workers)] + [("ps", j) for j in range(options.ps)]
    ports = free_ports(len(kinds), options.host)
    addresses: dict[str, list[str]] = {"chief": [], "worker": [], "ps": []}
    for (kind, _), port in zip(kinds, ports):
        addresses[kind].append(f"{options.host}:{port}")
    base, lock = worker_env(options, env), threading.Lock()
    say = functools.partial(say_line, err, lock)
    say(f"a parameter-server cluster ({network}): 1 chief, {options.workers} worker(s), {options.ps} ps: "
        f"{shlex.join(command)}")
    cores = worker_cores(options.workers) if options.pin_cores else None
    if cores is not None:
        say("pinned: " + ", ".join(f"worker {i} on core {c}" for i, c in enumerate(cores)))
    busy = None if options.slow_core is None else BusyCore(options.slow_core, options.slow_after)
    procs, pumps, names = [], [], []
    interrupted = Interrupts()
    try:
        for kind, i in kinds:
            pin = pin_to(cores[i]) if cores is not None and kind == "worker" else None
            proc = subprocess.Popen(command, env=dict(base, TF_CONFIG=ps_tf_config(addresses, kind, i)),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=pin)
            name = "chief" if kind == "chief" else f"{kind} {i}"
            procs.append(proc)
            names.append(name)
            for stream, target in ((proc.stdout, out), (proc.stderr, err)):
                pumps.append(Pump(stream, f"[{name}] ", target, lock))
                pumps[-1].start()
        _wait_for_chief(procs, names, interrupted, say)
    finally:
        interrupted.restore()
        stop_workers(procs[1:], options.grace_seconds)  # the servers serve until stopped
        stop_workers(procs, 0.0)
        if busy is not None:
            busy.stop()
        for pump in pumps:
            pump.join(timeout=5)
    if interrupted.signum is not None:
        return 128 + interrupted.signum
    chief = procs[0].returncode
    if chief not in (0, None):
        say(f"the chief {describe_exit(chief)}")
    return exit_code(chief) if chief is not None else 1


def _wait_for_chief(procs, names, interrupted: Interrupts, say) -> None:
    """Until the chief exits or the launcher is interrupted; servers that end early are reported once."""
    reported = set()
    while procs[0].poll() is None and interrupted.signum is None:
        for i, p in enumerate(procs[1:], start=1):
            if i not in reported and p.poll() is not None:
                reported.add(i)
                say(f"{names[i]} {describe_exit(p.returncode)}; the chief goes on without it")
        time.sleep(0.05)
    if interrupted.signum is not None:
        say(f"received {signal.Signals(interrupted.signum).name}; stopping the cluster")
