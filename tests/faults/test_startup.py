"""A worker whose peers never come cannot hang: a deadline and SIGTERM both end it with one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from evenflow.tf.launch.cluster import tf_config  # noqa: E402
from evenflow.tf.launch.local import free_ports  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.slow


def _lonely(tmp_path, *extra) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CONFIG=tf_config([f"127.0.0.1:{p}" for p in free_ports(2)], 0))
    env.pop("EVENFLOW_REPLICAS_PER_WORKER", None)
    cmd = [sys.executable, "-m", "evenflow", "train", "--dataset", "builtin:digits", "--replicas", "1",
           "--output-dir", str(tmp_path / "run"), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, within: float) -> tuple[str, float]:
    began = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the worker was still waiting after {within} s")
    return err, time.monotonic() - began


def test_a_worker_alone_stops_at_the_deadline_naming_the_missing_worker(tmp_path):
    proc = _lonely(tmp_path, "--collective-timeout", "5")
    err, _ = _finish(proc, 60)
    last = err.strip().splitlines()[-1]
    assert last.startswith("evenflow train: error: worker 0 of 2 waited 5 s for the other workers (worker 1 at "
                           "127.0.0.1:"), err[-2000:]
    assert "--collective-timeout" in last and "Traceback" not in err
    assert proc.returncode != 0 and not (tmp_path / "run").exists()


def test_sigterm_ends_a_worker_that_waits_for_the_others(tmp_path):
    proc = _lonely(tmp_path)  # the default deadline: 300 s
    time.sleep(6)  # TensorFlow started and waits for worker 1
    proc.send_signal(signal.SIGTERM)
    err, took = _finish(proc, 30)
    assert took < 10, took
    assert err.strip().splitlines()[-1] == "evenflow train: terminated (SIGTERM) while waiting for the other workers"
