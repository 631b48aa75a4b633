"""Checkpoints under attack: a full disk, a damaged newest checkpoint, a kill inside every phase of a save.

Each run is the real ``evenflow train`` (PyTorch, one process: the checkpoint logic is the
framework-neutral run layer's, the same for TensorFlow, whose saves the fault driver of
``tests/tf/test_fault_tolerance.py`` kills too). After each fault the same command is run
again; it resumes from the newest good checkpoint and the audit is exactly once.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._warm import warm_python

pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[2] / "src"
ARGS = ["--framework", "torch", "--dataset", "builtin:digits", "--epochs", "1", "--checkpoint-every", "5",
        "--keep-checkpoints", "10", "--audit", "--loader-workers", "0", "--no-telemetry"]


def _train(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # Started warm (tests/_warm.py, torch imported); a run the fault kills kills itself with SIGKILL.
    env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    cmd = ["timeout", "-k", "5", "180", *warm_python(env, "torch"), "-m", "evenflow", "train", *ARGS, *extra,
           "--output-dir", str(run_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def _audit_clean(run_dir: Path) -> bool:
    proc = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run_dir), "--json"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    return proc.returncode == 0 and json.loads(proc.stdout)["clean"]


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


@pytest.mark.parametrize("point", ["save-begin", "save-written", "save-synced", "save-renamed", "step"])
def test_a_kill_inside_a_save_leaves_the_previous_checkpoints_and_the_rerun_finishes_exactly_once(tmp_path, point):
    run_dir = tmp_path / "run"
    # The 3rd save (after the untrained model's and step 5's), or the 8th update: a checkpoint to go back to.
    killed = _train(run_dir, env={"EVENFLOW_FAULT": f"kill:{point}:{8 if point == 'step' else 3}"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    names = _checkpoints(run_dir)
    assert all(n.startswith(("ckpt-", ".tmp-ckpt-")) for n in names), names
    again = _train(run_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stdout
    assert not [n for n in _checkpoints(run_dir) if n.startswith(".")]  # the crashed save's leftovers are gone
    assert _audit_clean(run_dir)


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(tmp_path):
    run_dir = tmp_path / "run"
    first = _train(run_dir, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    newest = run_dir / "checkpoints" / _checkpoints(run_dir)[-1]
    previous = _checkpoints(run_dir)[-2]
    model = newest / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])  # truncated
    again = _train(run_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"evenflow train: warning: {newest}: cannot be restored" in again.stderr
    assert "trying the one before" in again.stderr and "UserWarning" not in again.stderr
    assert f"resuming from {run_dir / 'checkpoints' / previous}" in again.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": 0, "step": int(previous[-6:])}
    assert _audit_clean(run_dir)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_one_line_leaves_the_good_checkpoints_and_the_rerun_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=900k", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("this machine does not mount a tmpfs")
    try:
        full = _train(disk / "run")
        good = _checkpoints(disk / "run")
        shutil.copytree(disk / "run", tmp_path / "run")  # "free some space": the same run directory, elsewhere
    finally:
        subprocess.run(["umount", str(disk)])
    err = full.stderr.strip().splitlines()
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert err[-1].startswith("evenflow train: error: ") and ("No space left" in err[-1] or "os error 28" in err[-1])
    assert good and not [n for n in good if n.startswith(".")]  # no half-written checkpoint
    again = _train(tmp_path / "run")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {tmp_path / 'run' / 'checkpoints' / good[-1]}" in again.stdout
    assert _audit_clean(tmp_path / "run")
