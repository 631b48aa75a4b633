"""The TensorFlow numerics that must hold on every CPU, under both kernel paths.

``TF_ENABLE_ONEDNN_OPTS=1`` forces TensorFlow's oneDNN kernels on (the default on CPUs with
AVX-512 and similar), ``=0`` turns them off. Each path runs in its own process: the
kernel-sensitive checks of ``_kernel_worker.py`` (a replica batch with no sample for every
model, suspect attribution of a NaN sample) and this directory's variable-length text tests.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"
pytestmark = pytest.mark.slow


def _env(onednn: str) -> dict:
    return dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_empty_replica_batches_and_nan_suspects_on_both_kernel_paths(tmp_path, onednn):
    out = tmp_path / "out.json"
    proc = subprocess.run(["timeout", "-k", "5", "300", sys.executable, str(HERE / "_kernel_worker.py"), str(out)],
                          env=_env(onednn), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(out.read_text())
    for name, run in found["empty"].items():
        assert run["finite"], (onednn, name)
        # The masked loss makes 2 replicas (one of them empty in the last step) update like 1 replica.
        assert run["max_diff"] < 1e-4, (onednn, name, run)
        assert run["losses"] == pytest.approx(run["alone_losses"], rel=1e-4), (onednn, name, run)
    assert found["suspects"] == [5]  # the NaN sample, named on every kernel path


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_text_model_tests_on_both_kernel_paths(onednn):
    proc = subprocess.run(["timeout", "-k", "5", "300", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "test_text.py")], env=_env(onednn), capture_output=True, text=True,
                          cwd=HERE.parents[1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
