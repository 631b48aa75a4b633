"""Repeated runs in one process log no "triggered tf.function retracing" warning.

A sweep or a notebook calls ``evenflow.tf.fit`` (with checkpoints and an audit) or builds a
``Trainer`` many times; each run's functions trace once for its own model, which TensorFlow
must not report as excessive retracing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_retrace_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("mode", ["fit", "trainer"])
def test_repeated_runs_log_no_retracing_warning(mode):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # TensorFlow's Python warnings are what the test reads
    proc = subprocess.run(["timeout", "-k", "5", "300", sys.executable, str(WORKER), mode], env=env,
                          capture_output=True, text=True, timeout=320)
    log = proc.stderr + proc.stdout
    assert proc.returncode == 0 and "done" in proc.stdout, log[-3000:]
    assert "retracing" not in log, [line for line in log.splitlines() if "retracing" in line][:2]
