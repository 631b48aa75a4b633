"""``evenflow.tf.fit`` with a run directory reads its steps' records back from device buffers in batches of steps.

The steps write what each replica trained on into ring buffers on its device; the run's callback reads them
back at checkpoints, at epoch ends and before a buffer can overflow. With buffers of 3 steps, 7 steps per
epoch and a checkpoint every 4 steps, every sample is audited exactly once, every step has its telemetry line
in order, and the checkpoints sit where they are due.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_step_buffer_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_fit_reads_back_every_step_once_from_small_buffers(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(["timeout", "-k", "5", "240", sys.executable, str(WORKER), str(run)],
                          env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, (proc.stderr + proc.stdout)[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["buffer"] == "StepBuffer" and found["capacity"] == 3
    # Per epoch (7 steps): steps 1-3 (full), 4 (checkpoint), 5-7 (full, epoch end); 2 records (replicas) a step.
    assert [n for n in found["reads"] if n] == [6, 2, 6] * 2, found["reads"]
    from evenflow.run.audit import check_audit
    from evenflow.run.checkpoints import list_checkpoints
    audits = check_audit(run)
    assert [a.epoch for a in audits] == [0, 1] and all(a.clean and a.complete for a in audits)
    assert [(c.cursor.epoch, c.cursor.step) for c in list_checkpoints(run)] == [(0, 4), (1, 0), (1, 4), (2, 0)]
    steps = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    assert [(s["epoch"], s["step"]) for s in steps] == [(e, s) for e in range(2) for s in range(7)]
    assert sum(sum(s["samples"]) for s in steps) == 2 * 203
    assert all(min(s["compute"]) >= 0 and s["step_seconds"] > 0 for s in steps)
