"""`evenflow launch` with small Python workers (no TensorFlow): prefixes, exit codes, stopping the rest."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from evenflow.cli import main
from evenflow.tf.launch.local import LaunchOptions, free_ports

# Each worker reads its TF_CONFIG and replicas, reports them, then acts by its index.
WORKER = """
import json, os, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
i = config["task"]["index"]
print("worker", i, "of", len(config["cluster"]["worker"]), "replicas", os.environ.get("EVENFLOW_REPLICAS_PER_WORKER"))
print("note on stderr from", i, file=sys.stderr)
action = sys.argv[1:][i] if i < len(sys.argv) - 1 else "ok"
if action == "ok":
    sys.exit(0)
if action.startswith("exit"):
    time.sleep(0.3)
    sys.exit(int(action[4:]))
if action == "kill9":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
if action == "stubborn":  # like MultiWorkerMirroredStrategy: SIGTERM does not stop it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
"""


def _launch(*argv, timeout=60):
    try:
        return subprocess.run([sys.executable, "-m", "evenflow", "launch", *argv], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"evenflow launch {' '.join(argv)} did not finish within {timeout} s")


def test_every_line_is_prefixed_and_all_workers_succeed():
    proc = _launch("--workers", "3", "--replicas-per-worker", "2", "--", sys.executable, "-c", WORKER)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[worker {i}] worker {i} of 3 replicas 2" for i in range(3)]
    for i in range(3):
        assert f"[worker {i}] note on stderr from {i}" in proc.stderr.splitlines()
    ports = {line.split(":")[-1] for line in proc.stderr.splitlines()[0].split(": ", 1)[1].split(", ")[:3]}
    assert len(ports) == 3  # three distinct 127.0.0.1 ports


def test_the_first_failure_decides_the_exit_code_and_stubborn_workers_get_sigkill():
    began = time.monotonic()
    proc = _launch("--workers", "3", "--grace", "1", "--", sys.executable, "-c", WORKER, "stubborn", "exit3",
                   "stubborn")
    took = time.monotonic() - began
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert "evenflow launch: worker 1 exited with code 3; stopping the other 2 worker(s) (SIGTERM, then SIGKILL " \
           "after 1 s)" in lines
    assert "evenflow launch: worker 0 was killed by SIGKILL (exit code 137)" in lines
    assert "evenflow launch: worker 2 was killed by SIGKILL (exit code 137)" in lines
    assert took < 30  # not the stubborn workers' 120 s


def test_a_worker_killed_by_a_signal_counts_as_128_plus_the_signal():
    proc = _launch("--workers", "2", "--grace", "0", "--", sys.executable, "-c", WORKER, "stubborn", "kill9")
    assert proc.returncode == 137, proc.stderr
    assert "evenflow launch: worker 1 was killed by SIGKILL (exit code 137)" in proc.stderr


@pytest.mark.parametrize("argv, fragment", [
    (["--workers", "2"], "a command to run is required after --"),
    (["--workers", "0", "--", "true"], "workers must be at least 1, got 0"),
    (["--workers", "2", "--replicas-per-worker", "0", "--", "true"], "replicas_per_worker must be at least 1, got 0"),
    (["--workers", "2", "--", "no-such-program-evenflow"], "command 'no-such-program-evenflow' was not found"),
    (["--workers", "2", "--grace", "-1", "--", "true"], "grace_seconds must be at least 0, got -1"),
    (["--workers", "2", "--slow-core", "4096", "--", "true"], "--slow-core 4096: this process may run on cores"),
    (["--workers", "2", "--slow-core", "-1", "--", "true"], "slow_core must be at least 0, got -1; a core number"),
    (["--workers", "2", "--slow-after", "3", "--", "true"], "give --slow-core CORE too, or drop --slow-after"),
    (["--workers", "2", "--slow-core", "0", "--slow-after", "nan", "--", "true"], "slow_after must be at least 0, got nan"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragment):
    assert main(["launch", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evenflow launch: error: ") and fragment in err and "\n" not in err


def test_options_and_ports():
    assert LaunchOptions(2).grace_seconds == 10.0
    with pytest.raises(TypeError):
        LaunchOptions(2.0)
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(1024 <= p < 65536 for p in ports)


# Each worker reports its CPU affinity and the busy processes it can see, with their affinity.
PINNED = """
import json, os
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
busy = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if b"\\0-c\\0# evenflow-busy-core" in open(f"/proc/{pid}/cmdline", "rb").read():
            busy.append(sorted(os.sched_getaffinity(int(pid))))
    except OSError:
        pass
print("worker", i, "cores", sorted(os.sched_getaffinity(0)), "busy", busy)
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and 2 usable cores")
def test_pinned_workers_and_a_busy_core_that_ends_with_them():
    cores = sorted(os.sched_getaffinity(0))
    proc = _launch("--workers", "3", "--pin-cores", "--slow-core", str(cores[1]), "--", sys.executable, "-c", PINNED)
    assert proc.returncode == 0, proc.stderr
    expected = [cores[i % len(cores)] for i in range(3)]
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"[worker {i}] worker {i} cores [{c}] busy [[{cores[1]}]]" for i, c in enumerate(expected)]
    assert "evenflow launch: pinned: " + ", ".join(f"worker {i} on core {c}" for i, c in enumerate(expected)) \
        in proc.stderr.splitlines()
    pid = int(proc.stderr.split("a busy process (pid ")[1].split(")")[0])
    assert not os.path.exists(f"/proc/{pid}"), "the busy process outlived the launcher"


def test_unpinned_workers_keep_every_core_and_no_busy_process():
    proc = _launch("--workers", "1", "--", sys.executable, "-c", PINNED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"[worker 0] worker 0 cores {sorted(os.sched_getaffinity(0))} busy []"
