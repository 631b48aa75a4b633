"""``examples/tfrecord_chain.py``: the user's TFRecord chain and ``model.fit`` on 1 and 2 replicas.

Both runs print the same loss and the same weights (float tolerance): the plan, the exact
steps and the augmentation seeds keyed by (seed, epoch, sample id) do not depend on the
number of replicas.
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
EXAMPLE = ROOT / "examples" / "tfrecord_chain.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="2")


def _final(replicas: int, data_dir: Path) -> tuple[float, ...]:
    data_dir.mkdir()
    proc = subprocess.run(["timeout", "-k", "5", "240", *warm_python(ENV), str(EXAMPLE), "--replicas", str(replicas),
                           "--epochs", "1", "--data-dir", str(data_dir)], env=ENV, cwd=ROOT, capture_output=True,
                          text=True, timeout=255)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^29/29 ", proc.stdout, re.M), proc.stdout  # one epoch: 1,797 digits in steps of 64
    assert len(list(data_dir.glob("*.tfrecord.idx"))) == 2
    m = re.search(r"final: loss (\S+), accuracy (\S+), weights sum (\S+), norm (\S+)", proc.stdout)
    assert m, proc.stdout
    return tuple(float(v) for v in m.groups())


def test_one_and_two_replicas_train_the_same_model(tmp_path):
    one, two = _final(1, tmp_path / "one"), _final(2, tmp_path / "two")
    assert 0.0 < one[0] < 2.0 and one[1] > 0.5, one
    assert two == pytest.approx(one, rel=1e-4), (one, two)
