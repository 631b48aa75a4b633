"""Run ``_worker.py`` in a fresh process (one per replica count) with a hard timeout."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests._warm import warm_python

WORKER = Path(__file__).with_name("_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def run_worker(tmp_path):
    """``run_worker(spec) -> dict of arrays``; fails (never hangs) if the worker does not finish."""

    def run(spec: dict, timeout: float = 120) -> dict:
        tag = f"{spec['mode']}-r{spec['replicas']}-{len(list(tmp_path.iterdir()))}"
        spec_path, out = tmp_path / f"{tag}.json", tmp_path / f"{tag}.npz"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC))
        try:
            proc = subprocess.run([*warm_python(env), str(WORKER), str(spec_path), str(out)], env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:  # subprocess.run kills the child before raising
            stage = "after writing its results (at exit)" if out.exists() else "before writing its results"
            pytest.fail(f"worker {tag} did not finish within {timeout} s, {stage}; stderr tail:\n"
                        f"{(e.stderr or b'')[-2000:]!r}")
        if proc.returncode != 0:
            pytest.fail(f"worker {tag} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
        with np.load(out, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    return run
