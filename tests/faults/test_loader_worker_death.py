"""A PyTorch ``DataLoader`` worker process that dies: one line naming it, and the rerun resumes exactly once.

The run is the real ``evenflow train --framework torch --loader-workers 2``; one of its loader
worker processes (a child of the training process, found through ``/proc``) is killed with SIGKILL
after the checkpoint of step 5, as the kernel's out-of-memory killer would. In a user's own loop,
``plan_loader``'s iterator raises :class:`~evenflow.torch.worker_errors.LoaderWorkerDied` for a worker
that dies while the loop waits for a batch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from evenflow.torch import plan_loader  # noqa: E402
from evenflow.torch.worker_errors import (LoaderWorkerDied, WorkerDeath, exited_worker, watched,  # noqa: E402
                                          worker_death)

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
ARGS = ["train", "--framework", "torch", "--dataset", "builtin:digits", "--epochs", "3", "--loader-workers", "2",
        "--checkpoint-every", "5", "--audit", "--no-telemetry"]
DEADLINE_S = 60


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc/*/stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _loader_workers(pid: int) -> list[int]:
    """``pid``'s forked children (DataLoader workers run its own command line)."""
    try:
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    workers = []
    for child in _children(pid):
        try:
            if Path(f"/proc/{child}/cmdline").read_bytes() == own:
                workers.append(child)
        except OSError:
            continue
    return workers


def _train(run_dir: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evenflow", *ARGS, "--output-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, **(env or {})})


def _finish(proc: subprocess.Popen, until: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=max(until - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"evenflow train did not finish within {DEADLINE_S} s")


def test_a_killed_loader_worker_ends_its_rank_with_one_line_and_the_rerun_resumes_exactly_once(tmp_path):
    run_dir, until = tmp_path / "run", time.monotonic() + DEADLINE_S
    # 0.1 s per step: 69 steps leave seconds between the checkpoint of step 5 and the run's end.
    proc = _train(run_dir, env={"EVENFLOW_FAULT": "sleep:step:0.1"})
    victim, others = None, []
    while victim is None and proc.poll() is None and time.monotonic() < until:
        if (run_dir / "checkpoints" / "ckpt-00000-000005").is_dir():
            workers = _loader_workers(proc.pid)
            if workers:
                victim, others = workers[0], workers[1:]
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.02)
    out, err = _finish(proc, until)
    assert victim is not None, f"no loader worker was found to kill:\n{err[-2000:]}"
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, errors
    line = errors[0]
    assert line.startswith(f"evenflow train: error: DataLoader worker (pid {victim}) of rank 0 died (killed by signal "
                           f"9, SIGKILL); rank 0 stopped at epoch 0 step "), line
    newest = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*"))[-1]
    assert (f"Run the same command again to resume from the newest checkpoint, {run_dir / 'checkpoints' / newest}."
            in line), line
    assert "lower --loader-workers" in line and "out of memory" in line, line
    assert not [p for p in others if Path(f"/proc/{p}").exists()], "a loader worker outlived its rank"
    assert not (run_dir / "summary.json").exists()

    again = _train(run_dir)
    out, err = _finish(again, until)
    assert again.returncode == 0, err[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / newest}" in out, out[-2000:]
    audit = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run_dir), "--json"], capture_output=True,
                           text=True, env=ENV, timeout=max(until - time.monotonic(), 5))
    assert audit.returncode == 0 and json.loads(audit.stdout)["clean"], audit.stdout[-2000:]


class _Dies(torch.utils.data.Dataset):
    """Sample 17 ends the worker process that reads it: SIGKILL, or ``os._exit(3)``."""

    def __init__(self, how: str):
        self.how = how

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 17:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return np.zeros(3, np.float32), i % 2


@pytest.mark.parametrize("how, said", [("kill", "died (killed by signal 9, SIGKILL)"),
                                       ("exit", "died (exited with code 3)")])
def test_plan_loader_raises_an_error_naming_the_dead_worker_in_your_own_loop(how, said):
    loader = plan_loader(_Dies(how), 8, seed=0, num_workers=2, rank=0, world_size=1)
    batches = iter(loader)
    with pytest.raises(LoaderWorkerDied) as e:
        for _ in batches:
            pass
    assert e.value.rank == 0 and len(e.value.death.pids) == 1
    assert str(e.value).startswith(f"DataLoader worker (pid {e.value.death.pids[0]}) of rank 0 {said}; rank 0 "
                                   f"stopped at epoch 0 step "), str(e.value)
    assert "num_workers" in str(e.value) and "\n" not in str(e.value)


def test_a_worker_that_raises_names_the_sample_it_was_reading():
    class Raises(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            if i == 17:
                raise ValueError("cannot decode sample")
            return np.zeros(3, np.float32), i % 2

    with pytest.raises(ValueError, match="cannot decode sample") as e:
        list(plan_loader(Raises(), 8, seed=0, num_workers=2, rank=0, world_size=1))
    assert "Caught ValueError in DataLoader worker process" in str(e.value)  # torch's, with the worker's traceback
    assert "(raised by Raises[17] for sample ids 17, read by evenflow)" in str(e.value)


@pytest.mark.parametrize("message, death", [
    ("DataLoader worker (pid 4919) is killed by signal: Killed. ", WorkerDeath((4919,), signal=9)),
    ("DataLoader worker (pid 12) is killed by signal: Bus error. It is possible that dataloader's workers are out "
     "of shared memory. Please try to raise your shared memory limit.", WorkerDeath((12,), signal=7)),
    ("DataLoader worker (pid 12) exited unexpectedly with exit code 1. Details are lost due to multiprocessing. "
     "Rerunning with num_workers=0 may give better error trace.", WorkerDeath((12,), exit_code=1)),
    ("DataLoader worker (pid(s) 12, 13) exited unexpectedly", WorkerDeath((12, 13))),
    ("DataLoader worker (pid(s) 12) exited unexpectedly", WorkerDeath((12,), signal=11)),  # its exit code: -11
    ("Pin memory thread exited unexpectedly", WorkerDeath(())),
    ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
     "RuntimeError: DataLoader worker (pid 5) is killed by signal: Killed. ", None),
    ("connection closed by peer", None),
])
def test_torch_messages_of_a_dead_worker_are_read(message, death):
    assert worker_death(RuntimeError(message), {12: -11}) == death
    if death is not None and death.pids:
        assert f"DataLoader worker (pid{'s' if len(death.pids) > 1 else ''} " in death.who()


def test_a_dead_worker_is_read_behind_an_error_raised_while_handling_it():
    # torch's SIGCHLD handler can raise inside a checkpoint write, which reports its own error.
    try:
        try:
            raise RuntimeError("DataLoader worker (pid 4919) is killed by signal: Killed. ")
        except Exception:
            raise OSError("runs/a/checkpoints: the checkpoint could not be written; free disk space") from None
    except OSError as e:
        assert worker_death(e) == WorkerDeath((4919,), signal=9)
    assert worker_death(OSError("No space left on device")) is None


class _Worker:
    def __init__(self, pid, exitcode):
        self.pid, self.exitcode = pid, exitcode


class _LostConnection:
    """A DataLoader iterator whose worker 41 has exited with ``code``: receiving its batch loses the connection."""

    def __init__(self, code):
        self._workers = [_Worker(40, None), _Worker(41, code)]

    def __next__(self):
        raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.parametrize("code, said", [(3, "died (exited with code 3)"), (-9, "died (killed by signal 9, SIGKILL)")])
def test_a_connection_lost_to_a_worker_that_exited_names_that_worker(code, said):
    # The worker can die while the rank receives a batch's shared memory from it: the connection
    # is lost before torch's own check of its workers runs.
    with pytest.raises(LoaderWorkerDied) as e:
        next(watched(_LostConnection(code), lambda b: b, 0, 5, 4))
    assert str(e.value).startswith(f"DataLoader worker (pid 41) of rank 0 {said}; rank 0 stopped at epoch 1 step 1"), \
        str(e.value)


def test_a_connection_lost_while_every_worker_lives_is_not_read_as_a_death():
    assert exited_worker([_Worker(40, None)], wait=0.1) is None
    live = _LostConnection(None)
    live._workers = []
    with pytest.raises(ConnectionResetError):
        next(watched(live, lambda b: b, 0, 0, 4))
