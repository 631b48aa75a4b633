"""``evenflow train --engine ray --framework tf``: TensorFlow workers (MultiWorkerMirroredStrategy, ``TF_CONFIG`` set
by Ray's ``TensorflowTrainer``) on the module's local Ray cluster of 2 CPUs; a worker lost mid-run, Ray restarts the
group, it resumes from the run's newest checkpoint and ``evenflow audit`` finds every sample exactly once per epoch;
and a TensorFlow loop's own position through ``evenflow.ray.report_checkpoint`` / ``restored_position``.
Hard timeouts: a hang fails the test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import evenflow.ray
from evenflow.plan import Cursor
from tests.ray._ray_tf_loop import tf_position_loop
from tests.ray.conftest import RAY_ENV
from tests.ray.test_ray_train import _ray_workers, _written_since

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_cli_engine_ray_tf_restarts_a_lost_worker_and_the_audit_is_clean(ray_cluster, tmp_path):
    out = tmp_path / "run"
    # builtin:digits: 1,797 samples, 15 steps of 128 in its one epoch; 64 samples x 4 ms per replica and step;
    # killed after the checkpoint at step 3
    cmd = ["timeout", "-k", "5", "200", sys.executable, "-m", "evenflow", "train", "--engine", "ray", "--workers", "2",
           "--address", ray_cluster, "--framework", "tf", "--dataset", "builtin:digits", "--epochs", "1",
           "--global-batch-size", "128", "--test-fraction", "0", "--checkpoint-every", "3",
           "--simulate-sample-ms", "4", "--collective-timeout", "20", "--audit", "--output-dir", str(out)]
    env = {**os.environ, **RAY_ENV}
    with open(tmp_path / "cli.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            end = time.monotonic() + 150
            while not [p for p in (out / "checkpoints").glob("ckpt-*") if p.name != "ckpt-00000-000000"]:
                assert proc.poll() is None and time.monotonic() < end, (tmp_path / "cli.log").read_text()[-3000:]
                time.sleep(0.2)
            workers = _ray_workers()
            assert len(workers) == 2, workers
            os.kill(workers[-1], signal.SIGKILL)
            killed = time.time()
            while proc.poll() is None and not _written_since(out / "checkpoints", killed):
                time.sleep(0.1)
            print(f"\nevenflow train --engine ray --framework tf: worker killed -> the restarted group's first "
                  f"checkpoint {time.time() - killed:.1f} s")
            assert proc.wait(timeout=180) == 0, (tmp_path / "cli.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    audit = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-m", "evenflow", "audit", str(out), "--json"],
                           capture_output=True, text=True, env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["clean"] is True and [e["samples"] for e in report["epochs"]] == [1797], audit.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2 and summary["resumed_from"] is not None, summary


def test_a_tensorflow_loop_saves_its_own_position_in_the_ray_checkpoint(ray_cluster, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    result = TensorflowTrainer(tf_position_loop, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(name="tf-position", storage_path=str(tmp_path))).fit()
    assert result.error is None and result.checkpoint is not None
    position = evenflow.ray.restored_position(result.checkpoint)
    assert position == {"epoch": 1, "step": 3} and Cursor(**position) == Cursor(1, 3)


def test_a_reader_without_a_position_and_no_position_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"got NoneType; without one \(TensorFlow\) pass position="):
        evenflow.ray.report_checkpoint({"loss": 0.5}, None)
