"""``evenflow.tf.fit`` with a run directory reads its steps' records back from device buffers in batches of steps.

The steps write what each replica trained on into ring buffers on its device; the run's callback reads them
back at checkpoints, at epoch ends and before a buffer can overflow. With buffers of 3 steps, 7 steps per
epoch and a checkpoint every 4 steps, every sample is audited exactly once, every step has its telemetry line
in order, and the checkpoints sit where they are due. A read-back is also due at the first batch end
``READ_SECONDS`` after the last one, so ``telemetry.jsonl`` follows the run within seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

import pytest

from evenflow.plan.cursor import Cursor

WORKER = Path(__file__).with_name("_step_buffer_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.slow
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


def test_a_read_back_is_due_at_checkpoints_epoch_ends_a_full_buffer_and_after_read_seconds():
    import evenflow as ef
    from evenflow.tf.keras.run import READ_SECONDS, PlanCallback

    plan = ef.Plan(ef.Index(num_samples=100), ef.Topology(replicas=2), global_batch_size=10)  # 10 steps
    callback = PlanCallback(plan, plan, SimpleNamespace(capacity=4), Cursor(0, 0), guard=SimpleNamespace(every=3))
    callback.model, callback._read_at = SimpleNamespace(steps_per_execution=1), 100.0
    assert not callback._read_due(1, 100.5) and not callback._read_due(2, 100.5)
    assert callback._read_due(1, 100.0 + READ_SECONDS)  # seconds since the last read-back
    assert callback._read_due(3, 100.5)  # a checkpoint (every 3 steps)
    callback.cursor = Cursor(0, 3)
    assert not callback._read_due(5, 100.5) and callback._read_due(6, 100.5)  # 3 of 4 rows used, or a checkpoint
    callback.guard = None
    assert callback._read_due(7, 100.5) and not callback._read_due(6, 100.5)  # all 4 rows used, or room for 1
    callback.cursor = Cursor(0, 7)
    assert callback._read_due(10, 100.5)  # the epoch's end
    callback.cursor, callback.model.steps_per_execution = Cursor(0, 0), 2
    assert callback._read_due(3, 100.5) and not callback._read_due(2, 100.5)  # room for 1 or 2 rows: the next
    # call of Keras's train function runs 2 steps
