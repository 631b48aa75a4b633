"""evenflow on Ray Train (one local cluster of 2 CPUs): a run grown onto more workers, a worker lost mid-epoch.

Your own loop (``tests/ray/_ray_loop.py``: plan_sampler, evenflow.ray.report_checkpoint / restore) and
``evenflow train --engine ray``: after Ray restarts the worker group, or a checkpoint resumes on more
workers, every sample is trained exactly once per epoch. Hard timeouts: a hang fails the test.
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

from tests.ray._ray_loop import EPOCHS, N, committed_ids, train_loop
from tests.ray.conftest import RAY_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


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


def _ray_workers() -> list[int]:
    """The processes of Ray Train's workers (their title is ``ray::RayTrainWorker...``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::RayTrainWorker"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return sorted(pids)


def _written_since(folder: Path, t: float) -> bool:
    """Whether a checkpoint file in ``folder`` was written after time ``t``."""
    for path in folder.glob("ckpt-*/*"):
        try:
            if path.stat().st_mtime > t:
                return True
        except FileNotFoundError:  # an older checkpoint removed meanwhile (--keep-checkpoints)
            continue
    return False


def test_cli_engine_ray_restarts_a_lost_worker_and_the_audit_is_clean(ray_cluster, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    out = tmp_path / "run"
    cmd = ["timeout", "-k", "5", "200", sys.executable, "-m", "evenflow", "train", "--engine", "ray", "--workers", "2",
           "--address", ray_cluster, "--framework", "torch", "--dataset", str(tmp_path / "d.npz"), "--epochs", "2",
           "--global-batch-size", "16", "--test-fraction", "0", "--checkpoint-every", "2", "--loader-workers", "0",
           "--simulate-sample-ms", "60", "--collective-timeout", "30", "--audit", "--output-dir", str(out)]
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
            print(f"\nevenflow train --engine ray: worker killed -> the restarted group's first checkpoint "
                  f"{time.time() - killed:.1f} s")
            assert proc.wait(timeout=180) == 0, (tmp_path / "cli.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    audit = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-m", "evenflow", "audit", str(out), "--json"],
                           capture_output=True, text=True, env=env)
    assert audit.returncode == 0 and json.loads(audit.stdout)["clean"] is True, audit.stdout + audit.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["resumed_from"] is not None, summary
