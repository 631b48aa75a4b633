"""The planner keeps its scratch memory between calls (src/evenflow/plan/scratch.py).

Counted in minor page faults, not time: a fault is one 4 KiB page given back to the operating
system by one plan and faulted in again by the next.
"""
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc malloc's")

_FAULTS_PER_PLAN = """
import resource, sys
import numpy as np
import evenflow as ef
import evenflow.plan.scratch as scratch
if sys.argv[1] == "off":
    scratch._done = True  # as if the block had been freed already: the allocator keeps its start-up thresholds
n = 100_000
plan = ef.Plan(ef.Index(n, costs=np.random.default_rng(0).lognormal(0, 1, n)), ef.Topology(8),
               global_batch_size=64, balance="cost")
plan.epoch(0), plan.epoch(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for e in range(2, 12):
    plan.epoch(e)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _faults_per_plan(mode: str) -> float:
    got = subprocess.run([sys.executable, "-c", _FAULTS_PER_PLAN, mode], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    return float(got.stdout)


def test_a_fresh_process_plans_without_faulting_its_scratch_in_again():
    # About 6 MB of scratch per plan of 10^5 samples: ~1,000 faults per call when it goes back to the
    # operating system after every call, a handful when the allocator keeps it.
    kept, given_back = _faults_per_plan("on"), _faults_per_plan("off")
    assert given_back > 500, f"the allocator kept the scratch even without keep_scratch ({given_back} faults)"
    assert kept < 100, f"{kept} minor faults per plan of 10^5 samples: the scratch is not kept between calls"


def test_keep_scratch_frees_its_block_and_runs_once(monkeypatch):
    import numpy as np

    from evenflow.plan import scratch

    monkeypatch.setattr(scratch, "_done", False)
    sizes = []
    real_empty = np.empty
    monkeypatch.setattr(scratch.np, "empty", lambda n, dtype: sizes.append(n) or real_empty(1, dtype))
    scratch.keep_scratch()
    scratch.keep_scratch()
    assert sizes == [scratch.SCRATCH_BLOCK]
    assert scratch.SCRATCH_BLOCK < 32 << 20  # glibc raises its mmap threshold only for blocks up to 32 MiB
