"""evenflow installs and runs on the oldest Python that pyproject.toml's ``requires-python`` admits.

The test finds that interpreter on this machine (``python3.X`` on PATH, or a pyenv version), skips with
the reason when there is none, checks that every module of ``src`` compiles with it, installs evenflow
without extras into a fresh virtual environment (from the package index, through pip's usual cache)
and runs the command there: ``--help``, ``inspect`` of a plan, ``convert`` and ``inspect`` of records,
a TOML config, and the note evenflow adds to an error of a user's data code.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
           "Network is unreachable", "Could not resolve host")


def _oldest_version() -> str:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires.strip())
    assert found, f"requires-python {requires!r}: expected a lower bound like '>=3.10'"
    return f"{found.group(1)}.{found.group(2)}"


def _interpreter(version: str) -> str | None:
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}")] + sorted(str(p) for p in pyenv.glob(f"{version}.*/bin/python{version}"))
    for path in filter(None, candidates):
        done = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip() == version:
            return path
    return None


OLDEST = _oldest_version()
PYTHON = _interpreter(OLDEST)
pytestmark = pytest.mark.skipif(PYTHON is None, reason=f"no Python {OLDEST} (requires-python's oldest) on this machine: "
                                                       f"neither python{OLDEST} on PATH nor a pyenv {OLDEST}.x")

COMPILE_ALL = """import pathlib, sys
bad = []
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.py")):
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        bad.append(f"{path}:{e.lineno}: {e.msg}")
print("\\n".join(bad))
"""

NOTE = """from evenflow.util.read_errors import note_samples
error = OSError("shard 2 is gone")
note_samples(error, "Source.batch", [5, 6])
print(repr(str(error)), error.__notes__)
"""


def _run(args, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)


def test_every_module_compiles_with_the_oldest_python():
    done = _run([PYTHON, "-c", COMPILE_ALL, ROOT / "src"])
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtual environment of the oldest Python with evenflow installed, no extras."""
    where = tmp_path_factory.mktemp("oldest")
    source = where / "evenflow"  # a copy, so that pip's build leaves nothing in the checkout
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    _run([PYTHON, "-m", "venv", where / "venv"], check=True)
    pip = _run([where / "venv/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "-q", source],
               timeout=480)
    if pip.returncode != 0 and any(s in pip.stderr for s in OFFLINE):
        pytest.skip(f"the package index cannot be reached to install evenflow's dependencies for Python {OLDEST}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    return where / "venv/bin"


def test_the_command_runs_on_the_oldest_python(venv, tmp_path):
    done = _run([venv / "evenflow", "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(c in done.stdout for c in ("demo", "train", "inspect", "convert", "audit", "report")), done.stdout

    done = _run([venv / "evenflow", "inspect", "--samples", "1000", "--replicas", "4", "--batch-size", "64",
                 "--weights", "1,1,1,0.5", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["real_samples"] == 1000 and [r["real"] for r in plan["per_replica"]] == [289, 285, 285, 141]


def test_records_and_a_config_file_on_the_oldest_python(venv, tmp_path):
    done = _run([venv / "evenflow", "convert", "builtin:stdlib-docs", tmp_path / "docs"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _run([venv / "evenflow", "inspect", "--dataset", tmp_path / "docs", "--replicas", "2", "--batch-size", "32",
                 "--balance", "cost", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["real_samples"] == sum(r["real"] for r in plan["per_replica"]) > 1000

    (tmp_path / "run.toml").write_text('dataset = "builtin:digits"\nlearning_rate = 0.01\nepochs = 3\n')
    done = _run([venv / "python", "-c", "import sys; from evenflow.run.config import load_config; "
                 "c = load_config(sys.argv[1]); print(c.optimizer.learning_rate, c.schedule.epochs)",
                 tmp_path / "run.toml"])
    assert done.returncode == 0 and done.stdout.split() == ["0.01", "3"], done.stdout + done.stderr
    (tmp_path / "bad.toml").write_text("epochs = \n")
    done = _run([venv / "evenflow", "train", "--config", tmp_path / "bad.toml"], cwd=tmp_path)
    assert done.returncode == 2 and "bad.toml: not valid TOML" in done.stderr, done.stderr


def test_the_note_on_an_error_of_your_data_code_shows_on_the_oldest_python(venv):
    done = _run([venv / "python", "-c", NOTE])
    assert done.returncode == 0, done.stderr
    note = "(raised by Source.batch for sample ids 5, 6, read by evenflow)"
    assert done.stdout.strip() == f"{repr('shard 2 is gone' + chr(10) + note)} {[note]}"
