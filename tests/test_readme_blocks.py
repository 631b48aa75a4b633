"""Every Python block in README.md runs, each in a fresh process, on small data.

A block is preceded by a marker line ``<!-- test: NAME -->`` naming its set-up below: the
variables the block's prose assumes (a user's arrays, a converted dataset, their model) made
from installed data, in a scratch working directory. A Python block without a marker fails
this test, so a new block cannot go untested.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MARKER = re.compile(r"^<!-- test: (\S+) -->$")

DIGITS = """
import numpy as np
from sklearn.datasets import load_digits
_d = load_digits()
x, y = (_d.data[:400] / 16.0).astype(np.float32), _d.target[:400]
x_train, y_train, x_test, y_test = x[:300], y[:300], x[300:], y[300:]
"""

# name -> (set-up code run before the block, shell commands run first in the working directory)
SETUPS: dict[str, tuple[str, list[list[str]]]] = {
    "plan": ("import numpy as np\n_r = np.random.default_rng(0)\nlabels = _r.integers(0, 10, 10_000)\n"
             "lengths = _r.integers(1, 512, 10_000)\n", []),
    "tf-trainer": (DIGITS, []),
    "keras-fit": (DIGITS + "import keras\n", []),
    "cluster": (DIGITS + "import evenflow.data\nsource = evenflow.data.ArraySource(x, y)\n", []),
    "records": ("import numpy as np\nids = np.array([5, 0, 7, 7])\n",
                [["convert", "builtin:digits", "data/train", "--shards", "2"]]),
    "torch-trainer": (DIGITS + "import evenflow as ef\nfrom evenflow.data import ArraySource\n"
                      "test_source = ArraySource(x_test, y_test)\n"
                      "test_plan = ef.Plan(test_source.index(), ef.Topology(1), global_batch_size=64)\n",
                      [["convert", "builtin:digits", "data/digits", "--shards", "2"]]),
    "torch-own": (DIGITS + "import torch\ndataset = torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))\n"
                  "model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))\n"
                  "optimizer = torch.optim.SGD(model.parameters(), 0.1)\n", []),
    "token-writer": ("import os\nimport numpy as np\nimport tensorflow as tf\nos.makedirs('data/tokens')\n"
                     "_r = np.random.default_rng(0)\nsamples = [(_r.integers(0, 3000, _r.integers(0, 40)).tolist(), "
                     "int(_r.integers(0, 4))) for _ in range(60)]\n", []),
    # TFRecord files as a user has them (written without TensorFlow: the block starts it itself).
    "tf-chain": ("import io\nimport numpy as np\nimport keras\nfrom PIL import Image\nfrom sklearn.datasets import load_digits\n"
                 "from evenflow.records import RecordWriter, encode_example\n"
                 "_d = load_digits()\nfiles = ['digits-0.tfrecord', 'digits-1.tfrecord']\n"
                 "for _k, _path in enumerate(files):\n"
                 "    with RecordWriter(_path, write_index=False) as _w:\n"
                 "        for _img, _y in zip(_d.images[_k::2], _d.target[_k::2]):\n"
                 "            _b = io.BytesIO()\n"
                 "            Image.fromarray((_img * 16).clip(0, 255).astype(np.uint8)).save(_b, format='PNG')\n"
                 "            _w.write(encode_example({'image': _b.getvalue(), 'label': int(_y)}))\n", []),
    "token-api": ("import numpy as np\n_r = np.random.default_rng(0)\nnum_classes = 4\n"
                  "token_lists = [_r.integers(0, 5000, _r.integers(1, 60)) for _ in range(300)]\n"
                  "labels = _r.integers(0, num_classes, 300)\n", []),
}


def python_blocks() -> list[tuple[int, str | None, str]]:
    """(line, marker name or None, code) of every ```python block of README.md."""
    lines = (ROOT / "README.md").read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            marker = next((m[1] for m in (MARKER.match(lines[j].strip()) for j in range(max(0, i - 2), i)) if m), None)
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, marker, "\n".join(body)))
        i += 1
    return blocks


BLOCKS = python_blocks()


def test_every_python_block_has_a_test_marker():
    missing = [line for line, marker, _ in BLOCKS if marker is None or marker not in SETUPS]
    assert not missing, (f"README.md Python blocks at lines {missing} have no '<!-- test: NAME -->' line naming a "
                         f"set-up of tests/test_readme_blocks.py (known: {', '.join(SETUPS)})")


@pytest.mark.slow
@pytest.mark.parametrize("line,marker,code", [b for b in BLOCKS if b[1] in SETUPS],
                         ids=[f"line{b[0]}-{b[1]}" for b in BLOCKS if b[1] in SETUPS])
def test_readme_block_runs(tmp_path, line, marker, code):
    setup, commands = SETUPS[marker]
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    env.pop("TF_CONFIG", None)
    for args in commands:
        done = subprocess.run([sys.executable, "-m", "evenflow", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    program = textwrap.dedent(setup) + "\n" + code + "\n"
    try:
        proc = subprocess.run(["timeout", "-k", "5", "240", sys.executable, "-c", program], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=260)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md block at line {line} did not finish within 240 s")
    assert proc.returncode == 0, f"README.md block at line {line} failed:\n{proc.stderr[-3000:]}"
