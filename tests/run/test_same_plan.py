"""Processes that built different plans are refused on every process before any step (2 real gloo ranks)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from tests.torch.conftest import free_port, rank_env  # noqa: E402

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("_same_plan_worker.py")


def _run(plans: str, call: str) -> list[str]:
    port = free_port()
    procs = [subprocess.Popen(["timeout", "-k", "5", "90", sys.executable, str(WORKER), plans, call],
                              env=rank_env(r, 2, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=110) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return [out for out, _ in outs]


@pytest.mark.parametrize("call", ["fit", "evaluate"])
def test_a_seed_taken_from_the_rank_is_refused_on_both_ranks(call):
    for out in _run("differ", call):
        assert "refused: the processes built different plans (processes [0]; processes [1] agree among " \
               "themselves)" in out and "never a seed from the rank" in out


def test_the_same_plan_on_every_rank_runs():
    assert all(out.startswith("ran") for out in _run("same", "fit"))
