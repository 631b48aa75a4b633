"""evenflow on Ray Train (one local cluster of 2 CPUs): a run grown onto more workers, a worker lost mid-epoch.

Your own loop (``tests/ray/_ray_loop.py``: plan_sampler, evenflow.ray.report_checkpoint / restore) and
``evenflow train --engine ray`` with PyTorch ranks or TensorFlow workers (MultiWorkerMirroredStrategy,
``TF_CONFIG`` set by Ray's ``TensorflowTrainer``): after Ray restarts the worker group, or a checkpoint
resumes on more workers, every sample is trained exactly once per epoch (``evenflow audit`` for the
command). A TensorFlow loop's own position goes through ``evenflow.ray.report_checkpoint`` /
``restored_position``. One file, so that the suite's parallel pass (``--dist loadfile``) gives every test
of the cluster to one worker and starts the cluster once. Hard timeouts: a hang fails the test.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import evenflow.ray
from evenflow.plan import Cursor
from tests.ray._ray_loop import EPOCHS, N, committed_ids, train_loop
from tests.ray._ray_cli_kill import train_killing_a_worker
from tests.ray._ray_tf_loop import tf_cli_args, tf_position_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _fit(tmp_path: Path, name: str, workers: int, max_failures: int = 0, **cfg):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    config = {"log": str(tmp_path / "log.jsonl"), "marker": str(tmp_path / "killed"), **cfg}
    trainer = TorchTrainer(train_loop, train_loop_config=config, torch_config=TorchConfig(backend="gloo", timeout_s=60),
                           scaling_config=ScalingConfig(num_workers=workers),
                           run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray"),
                                                failure_config=FailureConfig(max_failures=max_failures)))
    return trainer.fit()


def _exactly_once(log: Path) -> dict[int, list[int]]:
    epochs = committed_ids(log)
    assert sorted(epochs) == list(range(EPOCHS))
    for epoch, ids in epochs.items():
        assert sorted(ids) == list(range(N)), f"epoch {epoch}: not each of the {N} samples once"
    return epochs


def _events(log: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["kind"] == kind]


def test_a_run_grown_from_one_worker_to_two_then_losing_one_mid_epoch_trains_every_sample_once(ray_cluster, tmp_path):
    first = _fit(tmp_path, "one", 1, stop_at=[0, 3])               # 1 worker: steps 0-3 of epoch 0, then stops
    assert first.error is None and first.checkpoint is not None
    # 2 workers from its checkpoint; the second is killed at step 2 of epoch 1 and Ray restarts the group
    second = _fit(tmp_path, "two", 2, max_failures=2, resume=first.checkpoint.path, kill_at=[1, 2])
    assert second.error is None
    log = tmp_path / "log.jsonl"
    _exactly_once(log)
    killed = float((tmp_path / "killed").read_text())
    starts = _events(log, "start")
    before = [(e["epoch"], e["step"], e["world"]) for e in starts if e["t"] < killed]
    assert before == [(0, 0, 1), (0, 4, 2), (0, 4, 2)]
    # restarted on 2 workers at a checkpoint Ray committed before the loss (one every 2 steps; the newest may
    # still have been uploading): the start of epoch 1 or its step 2
    restarts = {(e["epoch"], e["step"], e["world"]) for e in starts if e["t"] > killed}
    assert restarts in ({(1, 0, 2)}, {(1, 2, 2)}), restarts
    restarted = min(e["t"] for e in starts if e["t"] > killed)
    resumed = min(e["t"] for e in _events(log, "step") if e["t"] > restarted)
    print(f"\nRay restart: worker killed -> group restarted {restarted - killed:.1f} s, -> first step trained "
          f"{resumed - killed:.1f} s")


def test_cli_engine_ray_restarts_a_lost_worker_and_the_audit_is_clean(ray_cluster, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    out = tmp_path / "run"
    report = train_killing_a_worker(
        ["--engine", "ray", "--workers", "2", "--address", ray_cluster, "--framework", "torch", "--dataset",
         str(tmp_path / "d.npz"), "--epochs", "2", "--global-batch-size", "16", "--test-fraction", "0",
         "--checkpoint-every", "2", "--loader-workers", "0", "--simulate-sample-ms", "60", "--collective-timeout", "30",
         "--audit"], out, tmp_path, "evenflow train --engine ray")
    assert report["clean"] is True, report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["resumed_from"] is not None, summary


def test_cli_engine_ray_tf_restarts_a_lost_worker_and_the_audit_is_clean(ray_cluster, tmp_path):
    pytest.importorskip("tensorflow")
    out = tmp_path / "run"
    report = train_killing_a_worker(tf_cli_args(ray_cluster), out, tmp_path,
                                    "evenflow train --engine ray --framework tf")
    assert report["clean"] is True and [e["samples"] for e in report["epochs"]] == [1797], report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2 and summary["resumed_from"] is not None, summary


def test_a_tensorflow_loop_saves_its_own_position_in_the_ray_checkpoint(ray_cluster, tmp_path):
    pytest.importorskip("tensorflow")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    # One worker: rank 0's report holds the checkpoint; the other ranks' (none) runs in the 2-worker runs above.
    result = TensorflowTrainer(tf_position_loop, scaling_config=ScalingConfig(num_workers=1),
                               run_config=RunConfig(name="tf-position", storage_path=str(tmp_path))).fit()
    assert result.error is None and result.checkpoint is not None
    position = evenflow.ray.restored_position(result.checkpoint)
    assert position == {"epoch": 1, "step": 3} and Cursor(**position) == Cursor(1, 3)


def test_a_reader_without_a_position_and_no_position_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"got NoneType; without one \(TensorFlow\) pass position="):
        evenflow.ray.report_checkpoint({"loss": 0.5}, None)
