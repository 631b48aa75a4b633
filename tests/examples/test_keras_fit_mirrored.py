"""``examples/keras_fit_mirrored.py``: the seed Keras program on 2 replicas, checkpointed and audited, then resumed.

2 epochs on the digits with ``--output-dir``, then the same command with ``--epochs 3``:
the second run resumes at epoch 3 (prints only that epoch), and ``evenflow audit`` finds
every training sample exactly once in each of the 3 epochs.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests._warm import warm_python

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "keras_fit_mirrored.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="2")


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["timeout", "-k", "5", str(timeout), *warm_python(ENV), *args], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout + 15)


def test_the_seed_program_trains_resumes_and_sees_each_sample_once_per_epoch(tmp_path):
    run = str(tmp_path / "run")
    first = _run(str(EXAMPLE), "--epochs", "2", "--output-dir", run)
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.findall(r"^Epoch (\d)/2$", first.stdout, re.M) == ["1", "2"], first.stdout
    final = re.search(r"final: loss (\S+), val_loss (\S+), val_accuracy (\S+)", first.stdout)
    assert final and 0.0 < float(final[1]) < 2.3 and float(final[3]) > 0.5, first.stdout
    again = _run(str(EXAMPLE), "--epochs", "3", "--output-dir", run)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr and re.findall(r"^Epoch (\d)/3$", again.stdout, re.M) == ["3"]
    audit = _run("-m", "evenflow", "audit", run, timeout=60)
    assert audit.returncode == 0 and "3 epochs: every sample exactly once" in audit.stdout, audit.stdout
