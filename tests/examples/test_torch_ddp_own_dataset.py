"""``examples/torch_ddp_own_dataset.py`` under ``torchrun --nproc_per_node=2`` (gloo, 127.0.0.1) and alone.

300 digits, global batch 64 (the last step of each epoch has 44 samples), 3 epochs: both runs
exit 0, only rank 0 prints, every epoch counts each sample once, the loss falls, and the two
ranks print the losses of the single process.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_ddp_own_dataset.py"
ARGS = ["--samples", "300", "--epochs", "3", "--batch-size", "64"]
LINE = re.compile(r"^epoch (\d+): loss (\d+\.\d+) over (\d+) samples$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait at most ``timeout`` s, then kill the process group (torchrun and its ranks) and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{proc.args} did not finish within {timeout} s")
    return proc.returncode, out, err


def _epochs(out: str) -> list[tuple[int, float, int]]:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), f"unexpected output:\n{out}"
    return [(int(m[1]), float(m[2]), int(m[3])) for m in parsed]


def test_two_ranks_print_the_losses_of_one_process_and_count_every_sample_once():
    ddp = _start([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                  f"--master_port={_free_port()}", str(EXAMPLE), *ARGS])
    alone = _start([sys.executable, str(EXAMPLE), *ARGS])
    results = [_finish(ddp, 150), _finish(alone, 150)]
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
    two, one = (_epochs(out) for _, out, _ in results)
    assert [e for e, _, _ in two] == [1, 2, 3]  # rank 0 alone prints, once per epoch
    assert all(count == 300 for _, _, count in two + one)
    losses = [loss for _, loss, _ in two]
    assert losses[0] < 2.5 and losses[2] < losses[1] < losses[0]
    for (_, a, _), (_, b, _) in zip(two, one):
        assert a == pytest.approx(b, abs=1e-5)
