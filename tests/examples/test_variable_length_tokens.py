"""examples/variable_length_tokens.py runs: token records written by tf.io.TFRecordWriter, indexed, and
trained cost-balanced and bucketed on 2 replicas (a process of its own, started warm, with a hard timeout)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests._warm import warm_python

pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "variable_length_tokens.py"


def test_the_example_trains_on_its_token_records(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run([*warm_python(env), str(EXAMPLE), "--out", str(tmp_path), "--samples", "200",
                               "--epochs", "2"], env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:  # subprocess.run kills the child before raising
        pytest.fail(f"the example did not finish within 240 s; stderr tail: {(e.stderr or b'')[-2000:]!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    for k in range(2):  # the sidecars of `evenflow index --label-key label`
        assert all((tmp_path / f"tokens-{k}.tfrecord{suffix}").exists() for suffix in (".idx", ".meta.npz"))
    head = re.fullmatch(r"2 files, 200 sequences, vocabulary (\d+); epoch 0: tokens per replica (\d+), (\d+), "
                        r"cost imbalance ([\d.]+)", lines[0])
    assert head, lines[0]
    assert 2 < int(head[1]) <= 3001  # ids 0..2999 read as id + 1
    assert max(int(head[2]), int(head[3])) / min(int(head[2]), int(head[3])) < 1.05  # equal shares of tokens
    epochs = [re.fullmatch(r"epoch (\d): (\d+) samples \(per replica \[(\d+), (\d+)\]\), loss ([\d.]+), "
                           r"accuracy [\d.]+", line) for line in lines[1:3]]
    assert all(epochs), lines[1:3]
    assert [int(m[2]) for m in epochs] == [160, 160] and all(int(m[3]) + int(m[4]) == 160 for m in epochs)
    assert re.fullmatch(r"test: 40/40 samples, each once; loss [\d.]+, accuracy [\d.]+", lines[3]), lines[3]
