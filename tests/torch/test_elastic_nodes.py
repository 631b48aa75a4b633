"""Two ``torchrun`` agents (two "nodes") on 127.0.0.1 with a c10d rendezvous: one lost mid-run, one joining.

The recipe of docs/pytorch.md "Across machines": every node runs
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc_per_node=1 --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT --max-restarts=3 -m evenflow train --framework torch ...``. When a node is
lost, the survivor's rank loses contact and exits; its agent restarts it at the world size that is
left. When a node joins, the running agent sees it waiting, stops its rank (SIGTERM) and both agents
start their ranks at the larger world size. Either way the run resumes from its newest checkpoint,
every training sample is trained exactly once per epoch (``evenflow audit``) and the run ends normally.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.torch.conftest import SRC, free_port

pytestmark = pytest.mark.slow
pytest.importorskip("torch")


def _agent(root: Path, port: int, name: str, host: bool, sample_ms: int = 30) -> subprocess.Popen:
    """One node: a torchrun agent with one rank, in its own process group (killed whole, like a lost machine)."""
    cmd = ["timeout", "-k", "5", "150", sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2",
           "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic",
           f"--rdzv-conf=last_call_timeout=4,is_host={str(host).lower()}", "--max-restarts=3", "--monitor-interval=0.5",
           "-m", "evenflow", "train", "--framework", "torch", "--dataset", str(root / "d.npz"), "--model", "mlp",
           "--epochs", "1", "--global-batch-size", "16", "--checkpoint-every", "3", "--loader-workers", "0",
           "--simulate-sample-ms", str(sample_ms), "--collective-timeout", "30", "--audit", "--output-dir", str(root / "run")]
    # Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 a joining node never starts: the running agent keeps
    # the store address of its first round and does not publish it in the round the new node joins,
    # which waits 60 s for MASTER_ADDR (torch 2.13). LOGLEVEL=INFO: the agents' rendezvous in the logs.
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "LOGLEVEL": "INFO"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        env.pop(key, None)
    log = open(root / f"{name}.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)


def _data(root: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    np.savez(root / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))


def _wait_for_checkpoint(root: Path, agents, seconds: float = 90) -> None:
    end = time.monotonic() + seconds
    while not [p for p in (root / "run" / "checkpoints").glob("ckpt-*") if p.name != "ckpt-00000-000000"]:
        assert time.monotonic() < end and all(a.poll() is None for a in agents), _logs(root)
        time.sleep(0.2)


def _logs(root: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(root.glob("*.log")))


def _finish(root: Path, *agents: subprocess.Popen) -> dict:
    """Wait for every one of ``agents`` to exit 0; the run's audit (exactly once) and summary."""
    for agent in agents:
        try:
            agent.wait(timeout=150)
        finally:
            if agent.poll() is None:
                _kill(agent)
        assert agent.returncode == 0, _logs(root)
    audit = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-m", "evenflow", "audit",
                            str(root / "run"), "--json"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(SRC)})
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["clean"] is True, report
    return {"audit": report, "summary": json.loads((root / "run" / "summary.json").read_text())}


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (torchrun starts its ranks in sessions of their own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _kill(agent: subprocess.Popen) -> None:
    """Lose a node: SIGKILL its agent and every rank it started, at once."""
    if agent.poll() is None:
        for pid in _tree(agent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    agent.wait(timeout=30)


def test_a_lost_node_leaves_the_survivor_to_finish_at_world_size_one_exactly_once(tmp_path):
    _data(tmp_path)
    port = free_port()
    first = _agent(tmp_path, port, "first", host=True)  # it holds the rendezvous store: the node that must stay
    second = _agent(tmp_path, port, "second", host=False)
    try:
        _wait_for_checkpoint(tmp_path, [first, second])
        _kill(second)
        result = _finish(tmp_path, first)
    finally:
        _kill(first), _kill(second)
    assert result["summary"]["replicas"] == 1, result["summary"]
    assert result["summary"]["resumed_from"] is not None


def test_a_node_that_joins_makes_the_run_resume_on_both_at_world_size_two_exactly_once(tmp_path):
    _data(tmp_path)
    port = free_port()
    # alone: world size 1 after the last call; 60 ms a sample leaves it ~20 s of its epoch for the other to join
    first = _agent(tmp_path, port, "first", host=True, sample_ms=60)
    second = None
    try:
        _wait_for_checkpoint(tmp_path, [first])
        second = _agent(tmp_path, port, "second", host=False, sample_ms=60)
        result = _finish(tmp_path, first, second)
    finally:
        _kill(first)
        if second is not None:
            _kill(second)
    assert result["summary"]["replicas"] == 2, result["summary"]
    assert result["summary"]["resumed_from"] is not None
    # the steps before the join ran on one rank, the steps after it on two
    assert {n for e in result["audit"]["epochs"] for n in e["replica_counts"]} == {1, 2}, result["audit"]
