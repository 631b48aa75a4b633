"""A run directory is held by one run at a time, released by the kernel when its run dies, and a run
that could not start leaves no empty directory behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evenflow.cli import main

pytest.importorskip("torch")
SRC = Path(__file__).resolve().parents[2] / "src"


def _cmd(run_dir: Path, epochs: int) -> list[str]:
    return [sys.executable, "-m", "evenflow", "train", "--framework", "torch", "--dataset", "builtin:digits",
            "--epochs", str(epochs), "--loader-workers", "0", "--checkpoint-every", "5", "--output-dir", str(run_dir)]


def test_a_second_run_on_a_held_directory_stops_and_a_killed_run_releases_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_cmd(run_dir, 5000), env=dict(os.environ, PYTHONPATH=str(SRC)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(list((run_dir / "checkpoints").glob("ckpt-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # training has begun and saved
        assert first.poll() is None
        code = main(["train", "--framework", "torch", "--dataset", "builtin:digits", "--epochs", "5000",
                     "--output-dir", str(run_dir)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"output_dir {run_dir} is in use by another evenflow run (pid {first.pid} on " in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    again = subprocess.run([*_cmd(run_dir, 1), "--no-resume"], env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]  # the lock went with the killed process


def test_a_run_that_cannot_start_removes_the_directory_it_created(tmp_path, capsys):
    # Valid options and data, but no process group to join: the start fails after the directory was made.
    env = {"WORLD_SIZE": "2", "RANK": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code = main(["train", "--framework", "torch", "--dataset", "builtin:digits", "--replicas", "2",
                     "--output-dir", str(tmp_path / "new" / "run")])
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "MASTER_ADDR is not set" in err, err
    assert not (tmp_path / "new" / "run").exists()
