"""On a terminal: one bar per epoch that trains, none after the last, and the cursor shown again at exit.

The run is read through a pseudo-terminal (python's ``pty``), so rich draws its live bars exactly as a
person would see them, cursor escape sequences included.
"""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"


def _in_pty(args: list[str], timeout: float = 240) -> tuple[int, str]:
    """Run ``python -m evenflow ARGS`` with stdout and stderr on a pty; its exit code and everything it wrote."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", TERM="xterm-256color", COLUMNS="120")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "evenflow", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            pytest.fail(f"evenflow {' '.join(args)} did not finish within {timeout} s")
    finally:
        os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_no_bar_after_the_last_epoch_and_the_cursor_comes_back(tmp_path, framework):
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    replicas = ["--replicas", "2"] if framework == "tf" else []  # torch: one replica per process
    code, out = _in_pty(["train", "--framework", framework, "--dataset", "builtin:digits", *replicas,
                         "--epochs", "2", "--global-batch-size", "256", "--output-dir", str(tmp_path / "run")])
    assert code == 0, out[-3000:]
    assert HIDE in out, out[-2000:]  # rich drew live bars, hiding the cursor while it did
    assert out.rfind(SHOW) > out.rfind(HIDE), out[-2000:]  # the last word on the cursor shows it
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    labels = set(re.findall(r"epoch (\d+) \((\d+)/(\d+)\)", plain))
    assert labels == {("0", "1", "2"), ("1", "2", "2")}, labels  # no "epoch 2 (3/2)" bar
    assert all(int(k) <= int(n) for k, n in re.findall(r"\b(\d+)/(\d+)\b", plain)), plain[-2000:]
    assert "test accuracy" in plain


def test_a_stopped_bar_writes_nothing_more_and_closing_twice_writes_one_line():
    import io

    from evenflow.util.progress import ProgressBar

    log = io.StringIO()
    bar = ProgressBar(6, "epoch 0 (1/2)", stream=log)
    bar.update(2)
    bar.stop()  # training failed inside the epoch: no final line claims the epoch
    bar.close()
    assert log.getvalue() == ""
    done = ProgressBar(3, "epoch 1 (2/2)", stream=log)
    done.update(3)
    done.close(info="loss 0.1")
    done.close()
    assert log.getvalue().count("\n") == 1 and "3/3" in log.getvalue()
