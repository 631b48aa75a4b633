"""A command loads the framework it uses and no other: ``evenflow inspect`` and ``evenflow train --framework torch``
never import TensorFlow, Keras or evenflow's TensorFlow adapter; choosing TensorFlow sets up its import for the CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Runs the command in this process, then prints its exit code and every TensorFlow module it left loaded.
PROBE = """import sys
from evenflow.cli import main
code = main(sys.argv[1:])
print(code, sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras") or m.startswith("evenflow.tf")))
"""


def _probe(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_inspect_imports_no_tensorflow():
    assert _probe("inspect", "--samples", "1000", "--replicas", "4", "--batch-size", "64") == "0 []"


def test_train_with_torch_imports_no_tensorflow(tmp_path):
    out = _probe("train", "--framework", "torch", "--dataset", "builtin:digits", "--epochs", "1", "--replicas", "1",
                 "--output-dir", str(tmp_path / "run"))
    assert out == "0 []"


def test_choosing_tensorflow_leaves_out_keras_extras():
    code = ("from evenflow.commands.train import framework_adapter; from evenflow.tf import _lazy; "
            "print(_lazy._skip_extras); framework_adapter('tf'); print(_lazy._skip_extras, 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", "import sys; " + code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(SRC)), check=True)
    assert done.stdout.split() == ["False", "True", "False"]


def test_a_framework_is_a_folder_with_an_adapter():
    """--framework takes every folder of evenflow with an adapter.py, and gets that folder's ADAPTER."""
    code = ("from evenflow.run.options import FRAMEWORKS; from evenflow.commands.train import framework_adapter; "
            "print(*FRAMEWORKS, *[framework_adapter(n).name for n in FRAMEWORKS])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(SRC)), check=True)
    folders = sorted(p.parent.name for p in (SRC / "evenflow").glob("*/adapter.py") if p.parent.name != "run")
    assert folders == ["tf", "torch"]
    assert done.stdout.split() == folders + folders
