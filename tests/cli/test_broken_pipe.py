"""A reader that stops early (``evenflow ... | head``) ends the command quietly, as Unix tools do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report.test_run_report import _straggling, _write

SRC = Path(__file__).resolve().parents[2] / "src"


def test_output_to_a_reader_that_went_away_ends_quietly_with_the_sigpipe_status():
    # The reader closes its end before anything is written, as `head` does once it has its lines.
    proc = subprocess.Popen([sys.executable, "-m", "evenflow", "inspect", "--samples", "20000", "--replicas", "8",
                             "--batch-size", "64", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(SRC)))
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err  # no traceback, no "Broken pipe" line


@pytest.mark.parametrize("command", ["inspect", "report"])
def test_inspect_and_report_to_head_end_quietly(tmp_path, command):
    if command == "report":
        _write(tmp_path / "run", _straggling(50))
        args = ["report", str(tmp_path / "run")]
    else:
        args = ["inspect", "--samples", "20000", "--replicas", "8", "--batch-size", "64"]
    proc = subprocess.Popen([sys.executable, "-m", "evenflow", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(SRC)))
    proc.stdout.close()  # the reader went away before the first line, as `| head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err
    if command == "report":
        assert (tmp_path / "run" / "report.html").is_file()  # the page is written before the lines are printed
