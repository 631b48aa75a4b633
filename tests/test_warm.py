"""tests/_warm.py: a program started warm exits, prints and dies as it would in a fresh interpreter.

The server here preloads nothing (``"python"``), so these checks cost no framework import; the
TensorFlow and PyTorch servers differ only in what they import before forking.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._warm import SRC, _servers, warm_python

ENV = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")


def _server_pid() -> int:
    return next(proc.pid for key, (proc, _) in _servers.items() if key[0] == "python")


def test_code_runs_in_a_child_of_the_server_with_its_streams_cwd_argv_and_exit_status(tmp_path):
    code = ("import os, sys; print(os.getppid(), os.getcwd(), sys.argv[1:], os.environ['EXTRA']); "
            "sys.stderr.write('to stderr'); sys.exit(3)")
    proc = subprocess.run([*warm_python(ENV, "python"), "-c", code, "a", "b"], env=dict(ENV, EXTRA="x"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stderr == "to stderr", proc.stderr
    assert proc.stdout.split() == [str(_server_pid()), str(tmp_path), "['a',", "'b']", "x"]


def test_a_script_and_a_module_see_what_a_fresh_interpreter_gives_them(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys; print(__name__, sys.argv, sys.path[0]); raise SystemExit('a message')\n")
    proc = subprocess.run([*warm_python(ENV, "python"), str(script), "x"], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and proc.stderr == "a message\n", proc.stderr
    assert proc.stdout.strip() == f"__main__ {[str(script), 'x']} {tmp_path}"
    proc = subprocess.run([*warm_python(ENV, "python"), "-m", "evenflow", "--help"], env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "usage: evenflow" in proc.stdout, proc.stderr
    proc = subprocess.run([*warm_python(ENV, "python"), "-c", "raise ValueError('bad')"], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith("ValueError: bad"), proc.stderr


def test_a_signal_that_ends_the_program_ends_the_client(tmp_path):
    proc = subprocess.run([*warm_python(ENV, "python"), "-c", "import os; os.kill(os.getpid(), 9)"], env=ENV,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_client_takes_its_program_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    client = subprocess.Popen([*warm_python(ENV, "python"), "-c", code], env=ENV)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    client.kill()
    client.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the program outlived its client"


@pytest.mark.parametrize("variable", ["TF_ENABLE_ONEDNN_OPTS", "OMP_NUM_THREADS", "PYTHONHASHSEED"])
def test_another_value_of_an_import_time_variable_runs_a_fresh_interpreter(variable):
    warm = warm_python(ENV, "python")
    proc = subprocess.run([*warm, "-c", "import os; print(os.getppid())"], env=dict(ENV, **{variable: "1"}),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and int(proc.stdout) == os.getpid(), proc.stderr  # the client became the program
    assert sys.executable in warm


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_tf_config_and_pythonunbuffered_are_the_childs_own(unbuffered):
    """What ``evenflow launch`` sets per worker runs warm; PYTHONUNBUFFERED sends a partial line before a SIGKILL."""
    code = "import os; print(os.getppid(), os.environ['TF_CONFIG'], end=''); os.kill(os.getpid(), 9)"
    proc = subprocess.run([*warm_python(ENV, "python"), "-c", code],
                          env=dict(ENV, TF_CONFIG='{"task": 1}', PYTHONUNBUFFERED=unbuffered), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout == (f'{_server_pid()} {{"task": 1}}' if unbuffered else ""), proc.stderr


def test_the_program_runs_on_the_cores_its_client_may_use():
    """evenflow launch --pin-cores pins the process it starts: the client; its program runs on the same cores."""
    core = max(os.sched_getaffinity(0))
    code = "import os; print(os.getppid(), os.sched_getaffinity(0))"
    proc = subprocess.run([*warm_python(ENV, "python"), "-c", code], env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert proc.returncode == 0 and proc.stdout.split() == [str(_server_pid()), f"{{{core}}}"], proc.stderr
