"""What docs/install.md promises about the extras: each keeps the framework build already installed
(pip's own resolver, run on the requirements pyproject.toml declares), the adapters refuse a framework
older than the declared range in one line, and ``make`` installs the exact CPU builds of ci/constraints.txt."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from unittest import mock

import pytest
from packaging.requirements import Requirement

from evenflow.data import arrays, digits
from evenflow.util.framework_version import OLDEST_TENSORFLOW, OLDEST_TORCH

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
USER_EXTRAS = [name for name in EXTRAS if name != "dev"]


def _requirements(extra: str) -> list[Requirement]:
    return [r for r in map(Requirement, EXTRAS[extra]) if r.marker is None or r.marker.evaluate()]


def _oldest(requirement: Requirement) -> tuple[int, ...]:
    lower = [s.version for s in requirement.specifier if s.operator == ">="]
    assert len(lower) == 1, f"{requirement}: one lower bound (>=) expected"
    return tuple(int(n) for n in lower[0].split("."))


def test_the_framework_extras_declare_the_range_the_adapters_check():
    frameworks = {"tf": "tensorflow", "tf-cpu": "tensorflow-cpu", "torch": "torch"}
    for extra, name in frameworks.items():
        found = [r for r in _requirements(extra) if r.name in ("tensorflow", "tensorflow-cpu", "torch")]
        assert [r.name for r in found] == [name], f"{extra}: {found}"
        assert _oldest(found[0]) == (OLDEST_TORCH if name == "torch" else OLDEST_TENSORFLOW), found[0]
    for extra in USER_EXTRAS:
        pinned = [str(r) for r in map(Requirement, EXTRAS[extra]) if any(s.operator in ("==", "===")
                                                                         for s in r.specifier)]
        assert pinned == [], f"extra {extra!r} pins an exact build: {pinned}; pins belong in ci/constraints.txt"


def test_make_installs_the_exact_cpu_builds_of_the_constraints():
    pins = {Requirement(line).name: str(Requirement(line).specifier)
            for line in (ROOT / "ci/constraints.txt").read_text().splitlines() if line and not line.startswith("#")}
    assert pins == {"tensorflow-cpu": "==2.21.0", "tensorflow": "==2.21.0", "torch": "==2.13.0"}
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"^\t\$\(BIN\)/pip install -q (-c .*)$", makefile, re.M)
    assert installs == ["-c $(CONSTRAINTS) -e '.[tf-cpu,demo,report]'", "-c $(CONSTRAINTS) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch",
                        "-c $(CONSTRAINTS) -e '.[tf-cpu,torch,demo,report,s3,dev,ray]'"], installs
    assert "CONSTRAINTS := ci/constraints.txt" in makefile and "u.urlopen('https://download.pytorch.org/whl/cpu/', timeout=5)" in makefile


# (packages already installed, extra): pip must find every requirement of the extra satisfied.
KEEPS = [
    (["tensorflow==2.17.1"], "tf"),            # a GPU TensorFlow
    (["tensorflow-cpu==2.18.0"], "tf-cpu"),
    (["torch==2.9.1+cu128"], "torch"),         # a CUDA build of PyTorch
    (["tf-nightly==2.22.0.dev20260101"], "records"),  # any other TensorFlow distribution
]
OTHERS = ["pillow==11.0.0", "safetensors==0.5.0", "tensorboard==2.18.0", "scikit-learn==1.6.0", "matplotlib==3.9.0"]


def _venv_with(tmp_path: Path, installed: list[str]) -> Path:
    """A bare virtual environment in which ``installed`` are installed as far as pip can tell (their metadata)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    for spec in installed:
        name, version = spec.split("==")
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return venv / "bin" / "python"


def _pip_would_install(python: Path, requirements: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--isolated", "install", "--dry-run",
                           "--no-index", "--quiet", "--report", str(report), *requirements],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("installed,extra", KEEPS, ids=[e for _, e in KEEPS])
def test_an_extra_keeps_the_framework_build_already_installed(tmp_path, installed, extra):
    python = _venv_with(tmp_path, installed + OTHERS)
    done = _pip_would_install(python, EXTRAS[extra], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]  # --no-index: anything to install would be an error
    assert json.loads((tmp_path / "report.json").read_text())["install"] == []


def test_the_tf_extra_over_tensorflow_cpu_would_add_a_second_tensorflow(tmp_path):
    """Why there are two TensorFlow extras: pip counts tensorflow-cpu as another package than tensorflow."""
    python = _venv_with(tmp_path, ["tensorflow-cpu==2.18.0"] + OTHERS)
    done = _pip_would_install(python, EXTRAS["tf"], tmp_path)
    assert done.returncode != 0 and "tensorflow<3,>=2.16" in done.stderr.replace(" ", ""), done.stderr[-2000:]


def _refusal(module_name: str, version: str, monkeypatch) -> str:
    fake = types.ModuleType(module_name)
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, module_name, fake)
    if module_name == "torch":
        import evenflow.torch._lazy as lazy
        monkeypatch.setattr(lazy, "_MODULE", None)
        with pytest.raises(lazy.MissingFrameworkError) as e:
            lazy.torch()
    else:
        import evenflow.tf._lazy as lazy
        monkeypatch.setattr(lazy, "_MODULES", {})
        with pytest.raises(lazy.MissingFrameworkError) as e:
            lazy.tf()
    return str(e.value)


def test_an_older_framework_is_refused_in_one_line_with_the_fix(monkeypatch):
    assert _refusal("tensorflow", "2.15.1", monkeypatch) == (
        "evenflow needs TensorFlow 2.16 or later, and this environment has TensorFlow 2.15.1; run pip install -U "
        "'tensorflow>=2.16,<3' (or tensorflow-cpu, whichever of the two is installed)")
    assert _refusal("torch", "2.5.1+cu121", monkeypatch) == (
        "evenflow needs PyTorch 2.8 or later, and this environment has PyTorch 2.5.1+cu121; run pip install -U "
        "'torch>=2.8' (from the index of your CUDA or CPU build)")


@pytest.mark.parametrize("module_name,version", [("tensorflow", "2.16.0"), ("tensorflow", "2.22.0.dev20260101"),
                                                  ("torch", "2.8.0+cpu"), ("torch", "2.14.0a0+git1234")])
def test_a_framework_in_the_range_is_used(monkeypatch, module_name, version):
    fake = types.ModuleType(module_name)
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, module_name, fake)
    if module_name == "torch":
        import evenflow.torch._lazy as lazy
        monkeypatch.setattr(lazy, "_MODULE", None)
        assert lazy.torch() is fake
    else:
        import evenflow.tf._lazy as lazy
        monkeypatch.setattr(lazy, "_MODULES", {})
        assert lazy.tf() is fake


def test_the_digits_without_scikit_learn_say_in_one_line_which_extra_installs_it(tmp_path):
    """`evenflow demo` and `evenflow convert builtin:digits` need scikit-learn, which the demo extra installs."""
    code = ("import sys; sys.modules['sklearn'] = None; from evenflow.cli import main; "
            "sys.exit(main(['convert', 'builtin:digits', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("evenflow convert: error: builtin:digits needs scikit-learn, which ships the "
                                   "digits; run pip install 'evenflow[demo]' (or pip install scikit-learn)")

    def no_sklearn():
        raise ModuleNotFoundError("builtin:digits needs scikit-learn", name="sklearn")

    with mock.patch.object(digits, "load_digits", no_sklearn), \
            pytest.raises(ValueError, match=r"run pip install 'evenflow\[demo\]' \(or pip install scikit-learn\)$"):
        arrays.digits_arrays()  # what `evenflow demo` and `evenflow train --dataset builtin:digits` read
