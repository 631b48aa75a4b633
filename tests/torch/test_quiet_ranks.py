"""Under torchrun, process 0 speaks: the other ranks print no progress bars or results unless --verbose,
and every rank still prints its errors."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.torch.conftest import free_port, rank_env

SPOKEN = ("test accuracy", "global batch", "samples/s", "epoch 0 (1/1)")


def _two_ranks(args: list[str], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """``python -m evenflow ARGS`` as ranks 0 and 1 of a gloo group; each rank's exit code, stdout and stderr."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "evenflow", *args], env=rank_env(r, 2, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    except subprocess.TimeoutExpired:
        pytest.fail(f"evenflow {' '.join(args)} on 2 ranks did not finish within {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return done


@pytest.mark.parametrize("verbose", [False, True])
def test_rank_1_is_quiet_unless_verbose(tmp_path, verbose):
    args = ["train", "--framework", "torch", "--dataset", "builtin:digits", "--epochs", "1",
            "--global-batch-size", "256", "--output-dir", str(tmp_path / "run"), *(["--verbose"] if verbose else [])]
    rank0, rank1 = _two_ranks(args)
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    both0 = rank0.stdout + rank0.stderr
    assert all(word in both0 for word in SPOKEN), both0
    both1 = rank1.stdout + rank1.stderr
    if verbose:
        assert all(word in both1 for word in SPOKEN), both1
    else:
        assert not any(word in both1 for word in SPOKEN), both1
        assert rank1.stdout == "", rank1.stdout


def test_every_rank_prints_its_error(tmp_path):
    missing = tmp_path / "missing.npz"
    rank0, rank1 = _two_ranks(["train", "--framework", "torch", "--dataset", str(missing),
                               "--output-dir", str(tmp_path / "run")], timeout=120)
    for rank in (rank0, rank1):
        assert rank.returncode == 2 and "evenflow train: error:" in rank.stderr and str(missing) in rank.stderr, \
            rank.stderr
