"""A reader that stops early (``evenflow ... | head``) ends the command quietly, as Unix tools do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_output_to_a_reader_that_went_away_ends_quietly_with_the_sigpipe_status():
    # The reader closes its end before anything is written, as `head` does once it has its lines.
    proc = subprocess.Popen([sys.executable, "-m", "evenflow", "inspect", "--samples", "20000", "--replicas", "8",
                             "--batch-size", "64", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(SRC)))
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err  # no traceback, no "Broken pipe" line
