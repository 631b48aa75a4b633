"""``evenflow train --engine ray --framework tf``: TensorFlow workers (MultiWorkerMirroredStrategy, ``TF_CONFIG`` set
by Ray's ``TensorflowTrainer``) on the package's local Ray cluster of 2 CPUs; a worker lost mid-run, Ray restarts the
group, it resumes from the run's newest checkpoint and ``evenflow audit`` finds every sample exactly once per epoch;
and a TensorFlow loop's own position through ``evenflow.ray.report_checkpoint`` / ``restored_position``.
Hard timeouts: a hang fails the test.
"""
from __future__ import annotations

import json

import pytest

import evenflow.ray
from evenflow.plan import Cursor
from tests.ray._ray_tf_loop import tf_position_loop
from tests.ray._ray_cli_kill import train_killing_a_worker

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_cli_engine_ray_tf_restarts_a_lost_worker_and_the_audit_is_clean(ray_cluster, tmp_path):
    out = tmp_path / "run"
    # builtin:digits: 1,797 samples, 15 steps of 128 in its one epoch; 64 samples x 4 ms per replica and step;
    # killed after the checkpoint at step 3
    report = train_killing_a_worker(
        ["--engine", "ray", "--workers", "2", "--address", ray_cluster, "--framework", "tf", "--dataset",
         "builtin:digits", "--epochs", "1", "--global-batch-size", "128", "--test-fraction", "0", "--checkpoint-every",
         "3", "--simulate-sample-ms", "4", "--collective-timeout", "20", "--audit"], out, tmp_path,
        "evenflow train --engine ray --framework tf")
    assert report["clean"] is True and [e["samples"] for e in report["epochs"]] == [1797], report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2 and summary["resumed_from"] is not None, summary


def test_a_tensorflow_loop_saves_its_own_position_in_the_ray_checkpoint(ray_cluster, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    # One worker: rank 0's report holds the checkpoint; the other ranks' (none) runs in test_ray_train's 2 workers.
    result = TensorflowTrainer(tf_position_loop, scaling_config=ScalingConfig(num_workers=1),
                               run_config=RunConfig(name="tf-position", storage_path=str(tmp_path))).fit()
    assert result.error is None and result.checkpoint is not None
    position = evenflow.ray.restored_position(result.checkpoint)
    assert position == {"epoch": 1, "step": 3} and Cursor(**position) == Cursor(1, 3)


def test_a_reader_without_a_position_and_no_position_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"got NoneType; without one \(TensorFlow\) pass position="):
        evenflow.ray.report_checkpoint({"loss": 0.5}, None)
