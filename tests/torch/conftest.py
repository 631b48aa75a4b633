"""Start real rank processes on 127.0.0.1 with a hard deadline; skip the package without PyTorch."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests._warm import warm_python

try:
    import torch
except ModuleNotFoundError:  # without pip install 'evenflow[torch]' these tests are not collected
    collect_ignore_glob = ["test_*.py"]
else:
    # One intra-op thread: with two on a 2-core machine shared with other jobs, a step of a tiny model
    # spin-waits for a busy core (1.2 ms -> 63 ms measured), which is what `evenflow train` avoids too.
    torch.set_num_threads(1)

WORKER = Path(__file__).with_name("_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")


def rank_python() -> list[str]:
    """The argv prefix that starts a rank warm: forked from a process that has imported torch (tests/_warm.py),
    with this module's rank variables (a rank that kills itself, or is killed by SIGKILL, ends as a fresh one)."""
    return warm_python(rank_env(0, 1, 0), "torch")


@dataclass
class RankRun:
    """What one rank process did: exit code, stderr, seconds until it exited, its results (if written)."""

    returncode: int
    stderr: str
    seconds: float
    found: dict | None


def run_ranks(groups: list[tuple], timeout: float) -> list[list[RankRun]]:
    """Start every group of ranks at once, wait at most ``timeout`` s, SIGKILL stragglers and fail.

    Args:
        groups: ``(argv_of, world, out_of)`` per group, optionally with a fourth ``env_of(rank)`` of extra
            variables: ``argv_of(rank)`` is a rank's command, ``out_of(rank)`` the .npz it writes (or
            None). Each group gets its own port.
        timeout: seconds for all of them together; a hung process fails the test, never the suite.
    """
    began = time.monotonic()
    procs = []  # (group, rank, Popen)
    for g, (argv_of, world, _, *extra) in enumerate(groups):
        port = free_port()
        env_of = extra[0] if extra else (lambda r: {})
        procs += [(g, r, subprocess.Popen(argv_of(r), env={**rank_env(r, world, port), **env_of(r)},
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                  for r in range(world)]
    ended: dict[int, float] = {}
    try:
        while len(ended) < len(procs) and time.monotonic() - began < timeout:
            for i, (_, _, p) in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - began
            time.sleep(0.05)
    finally:
        hung = [i for i in range(len(procs)) if i not in ended]
        for i in hung:
            procs[i][2].send_signal(signal.SIGKILL)
        errs = [p.communicate(timeout=30)[1] or "" for _, _, p in procs]
    if hung:
        tails = "\n".join(f"group {procs[i][0]} rank {procs[i][1]}: {errs[i][-1500:]}" for i in hung)
        pytest.fail(f"{len(hung)} rank process(es) did not finish within {timeout} s and were killed:\n{tails}")
    out: list[list[RankRun]] = [[] for _ in groups]
    for i, (g, r, p) in enumerate(procs):
        path, found = groups[g][2](r), None
        if path is not None and Path(path).exists():
            with np.load(path, allow_pickle=False) as z:
                found = {k: z[k] for k in z.files}
        out[g].append(RankRun(p.returncode, errs[i], ended[i], found))
    return out


def one_and_two_ranks(worker: Path, root: Path, timeout: float) -> tuple[dict, list[dict]]:
    """``python WORKER OUT.npz`` on 1 rank and on 2 ranks at once (started warm); what each rank wrote."""
    python = rank_python()
    groups = [(lambda r, w=w: [*python, str(worker), str(root / f"w{w}-{r}.npz")], w,
               lambda r, w=w: root / f"w{w}-{r}.npz") for w in (1, 2)]
    one, two = run_ranks(groups, timeout=timeout)
    for world, ranks in ((1, one), (2, two)):
        for r, run in enumerate(ranks):
            assert run.returncode == 0 and run.found is not None, f"rank {r} of {world} failed:\n{run.stderr[-3000:]}"
    return one[0].found, [run.found for run in two]


def saved_params(found: dict, name: str) -> list[np.ndarray]:
    """The 4 parameter arrays a worker saved under ``NAME_p0..3``."""
    return [found[f"{name}_p{i}"] for i in range(4)]


@pytest.fixture
def torchrun():
    """``torchrun(args, timeout) -> CompletedProcess``: ``torchrun --nproc_per_node=2 -m evenflow ARGS``, killed at the deadline."""

    def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", "-m", "evenflow", *args]
        env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks
            proc.communicate()
            pytest.fail(f"torchrun did not finish within {timeout} s")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    return run


@pytest.fixture(scope="module")
def run_workers(tmp_path_factory):
    """``run_workers([(spec, world, tag), ...], timeout) -> [[RankRun] per group]``: ``_worker.py`` per rank, groups at once."""
    return _workers(tmp_path_factory.mktemp("ranks"), [sys.executable])


@pytest.fixture(scope="module")
def warm_workers(tmp_path_factory):
    """``run_workers`` with each rank started warm: forked from a process that has imported torch (tests/_warm.py)."""
    return _workers(tmp_path_factory.mktemp("ranks"), rank_python())


def _workers(root: Path, python: list[str]):
    def run(groups: list[tuple], timeout: float = 120) -> list[list[RankRun]]:
        specs = []
        for spec, world, tag in groups:
            (root / f"{tag}.json").write_text(json.dumps(spec))
            prefix = root / tag
            specs.append((lambda r, tag=tag, prefix=prefix: [*python, str(WORKER), str(root / f"{tag}.json"),
                                                               str(prefix)],
                          world, lambda r, prefix=prefix: f"{prefix}-{r}.npz"))
        return run_ranks(specs, timeout)

    run.root = root
    return run
