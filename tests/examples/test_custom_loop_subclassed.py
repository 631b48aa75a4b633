"""``examples/custom_loop_subclassed.py``: the user's own loop and subclassed model, 1 and 4 replicas.

203 digits, global batch 64 (every epoch ends with an 11-sample step, padded on 4 replicas):
both runs print the same per-epoch losses over all 203 samples and end with the same weights.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests._warm import warm_python

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_loop_subclassed.py"


def _run(replicas: int, save: Path, timeout: float = 180) -> list[tuple[float, int]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(["timeout", "-k", "5", str(timeout), *warm_python(env), str(EXAMPLE), "--replicas",
                           str(replicas), "--samples", "203", "--epochs", "2", "--save", str(save)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 15)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.findall(r"^epoch \d: loss (\S+) over (\d+) samples$", proc.stdout, re.M)
    assert len(found) == 2, proc.stdout
    return [(float(loss), int(n)) for loss, n in found]


def test_one_and_four_replicas_train_the_same_weights(tmp_path):
    one, four = _run(1, tmp_path / "one.npz"), _run(4, tmp_path / "four.npz")
    assert [n for _, n in one] == [n for _, n in four] == [203, 203]
    np.testing.assert_allclose([loss for loss, _ in four], [loss for loss, _ in one], rtol=1e-5)
    with np.load(tmp_path / "one.npz") as a, np.load(tmp_path / "four.npz") as b:
        for key in a.files:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6)
