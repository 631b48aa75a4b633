"""``evenflow.tf.fit`` on 2 MultiWorkerMirroredStrategy workers (real processes on 127.0.0.1, hard timeouts).

Two workers of one replica each train the weights one process trains with the same global batch,
write an audit trail that ``evenflow audit`` finds exactly once, and a run whose worker stops
taking part (or is killed) ends on the other worker with one line; the same command again resumes
from the newest checkpoint to the weights of the unbroken run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evenflow.tf.launch.cluster import tf_config
from evenflow.tf.launch.local import free_ports
from tests._warm import warm_python

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_keras_fit_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
for key in ("TF_CONFIG", "EVENFLOW_REPLICAS_PER_WORKER"):
    ENV.pop(key, None)


def _run(cmd: list[str], seconds: int, env=None) -> subprocess.CompletedProcess:
    """Run ``cmd`` under ``timeout -k 5`` (MultiWorkerMirroredStrategy catches SIGTERM; -k sends SIGKILL)."""
    return subprocess.run(["timeout", "-k", "5", str(seconds), *cmd], env=env or ENV, capture_output=True, text=True)


def _spec(tmp_path: Path, name: str, **spec) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def _load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _weights(found: dict) -> list[np.ndarray]:
    return [found[f"w{i}"] for i in range(sum(1 for k in found if k.startswith("w")))]


def _launch(tmp_path: Path, spec: str, out: str, warm: bool = False) -> subprocess.CompletedProcess:
    """``evenflow launch`` of 2 workers; ``warm``: they start warm (tests/_warm.py)."""
    return _run([sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--grace", "2", "--",
                 *(warm_python(ENV) if warm else [sys.executable]), str(WORKER), spec, out], 240)


def _audit(run_dir: Path) -> str:
    done = _run([sys.executable, "-m", "evenflow", "audit", str(run_dir)], 120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """What the one-process run (one replica, global batch 32) ends with: weights and history."""
    tmp = tmp_path_factory.mktemp("one")
    done = _run([*warm_python(ENV), str(WORKER), _spec(tmp, "one", epochs=2), str(tmp / "one.npz")], 180)
    assert done.returncode == 0, done.stderr[-3000:]
    return _load(tmp / "one.npz")


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, one):
    """The one-process run and the 2-worker run under `evenflow launch` (nothing timed is checked on it: a
    60 s collective timeout; these tests run in the suite's parallel pass, tests/conftest.py)."""
    tmp = tmp_path_factory.mktemp("unbroken")
    two = _launch(tmp, _spec(tmp, "two", epochs=2, output_dir=str(tmp / "run"), timeout=60),
                  str(tmp / "two-{worker}.npz"), warm=True)
    assert two.returncode == 0, two.stderr[-4000:]
    return tmp, one, [_load(tmp / f"two-{w}.npz") for w in (0, 1)], two


def test_two_workers_train_the_weights_and_history_of_one_process_with_the_same_global_batch(unbroken):
    tmp, one, two, _ = unbroken
    for found in two:
        for got, want in zip(_weights(found), _weights(one)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        got, want = json.loads(str(found["history"])), json.loads(str(one["history"]))
        assert sorted(got) == sorted(want) == ["accuracy", "loss", "val_accuracy", "val_loss"]
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5)
    saved = json.loads((tmp / "run" / "history.json").read_text())["epochs"]
    assert sorted(saved) == ["0", "1"]


def test_two_workers_audit_every_sample_exactly_once(unbroken):
    tmp, _, _, _ = unbroken
    run = tmp / "run"
    assert sorted(p.name for p in (run / "audit").glob("e*.npz")) == [
        f"e{e:05d}-s000000-000007-w{w:03d}.npz" for e in (0, 1) for w in (0, 1)]
    assert (run / "audit" / "ids.npz").is_file()
    report = _audit(run)
    assert "2 epochs: every sample exactly once" in report, report


def test_a_worker_that_stops_ends_the_other_with_one_line_and_the_same_command_resumes_to_the_same_weights(
        one, tmp_path):
    run = tmp_path / "run"
    # Worker 1 stops taking part after its 5th step (alive, asleep): worker 0's next collective waits
    # past the collective timeout (8 s) and ends with one line; worker 1, still asleep, is then killed.
    stalled = _spec(tmp_path, "stalled", epochs=2, output_dir=str(run), checkpoint_every=2, timeout=8,
                    stall_after=5, stall_worker=1)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [subprocess.Popen(["timeout", "-k", "5", "150", sys.executable, str(WORKER), stalled,
                               str(tmp_path / "stalled-{worker}.npz")],
                              env=dict(ENV, TF_CONFIG=tf_config(addresses, i)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for i in (0, 1)]
    try:
        outs = [procs[0].communicate(timeout=200)]
        asleep = procs[1].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    outs.append(procs[1].communicate(timeout=30))
    err0 = outs[0][1]
    assert procs[0].returncode == 1, err0[-3000:]
    last = err0.strip().splitlines()[-1]
    assert last.startswith("evenflow.tf.strategy.CollectiveFailure: worker 0 of 2 lost the other workers "
                           "(DeadlineExceededError: Collective has timed out during execution: a call waited more "
                           "than 8 s"), last
    assert f"resume from {run}" in last or "checkpoint" in last, last
    assert "STALLING" in outs[1][0] and asleep  # it stalled, and did not end on its own
    assert list((run / "checkpoints").glob("ckpt-00000-000004*")), sorted(p.name for p in (run / "checkpoints").iterdir())
    # The same command (without the stall) resumes from the newest checkpoint and finishes the run.
    again = _launch(tmp_path, _spec(tmp_path, "again", epochs=2, output_dir=str(run), checkpoint_every=2),
                    str(tmp_path / "again-{worker}.npz"))
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resuming from" in again.stderr and "epoch 0 step 4" in again.stderr, again.stderr[-3000:]
    for w in (0, 1):
        for got, want in zip(_weights(_load(tmp_path / f"again-{w}.npz")), _weights(one)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "2 epochs: every sample exactly once" in _audit(run)


def test_a_killed_worker_ends_the_other_at_once_with_one_line_naming_the_checkpoint(tmp_path):
    # Worker 1 is killed (SIGKILL) after its 5th step; worker 0 must not wait for the 120 s collective
    # timeout: the reset connection or TensorFlow's heartbeats end it with the one-line error.
    run = tmp_path / "run"
    spec = _spec(tmp_path, "killed", epochs=2, output_dir=str(run), checkpoint_every=2, timeout=120, stall_after=5,
                 stall_worker=1)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [subprocess.Popen(["timeout", "-k", "5", "150", sys.executable, str(WORKER), spec,
                               str(tmp_path / "killed-{worker}.npz")], env=dict(ENV, TF_CONFIG=tf_config(addresses, i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for i in (0, 1)]
    try:
        for line in procs[1].stdout:
            if "STALLING" in line:
                break
        os.killpg(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err0 = procs[0].communicate(timeout=100)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert procs[0].returncode == 1, err0[-3000:]
    last = err0.strip().splitlines()[-1]
    assert last.startswith("evenflow.tf.strategy.CollectiveFailure: worker 0 of 2 lost the other workers ("), last
    assert "rerun the same command on every worker to resume from" in last and "ckpt-00000-000004" in last, last
    assert waited < 60, f"worker 0 took {waited:.1f} s to notice"
