"""docs/api.md is what docs/make_api_md.py makes from the package faces' docstrings today, without a framework;
and every subpackage face says what of it is public."""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _maker():
    spec = importlib.util.spec_from_file_location("make_api_md", ROOT / "docs" / "make_api_md.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date():
    maker = _maker()
    have = (ROOT / "docs" / "api.md").read_text()
    assert have == maker.render(), "docs/api.md is stale: run `python docs/make_api_md.py` and commit the result"
    # Every face has its section, and every name it exports its entry.
    for face in maker.FACES:
        assert f'<a id="{face}"></a>\n\n## `{face}`\n' in have
        for name in importlib.import_module(face).__all__:
            assert f"### `{face}.{name}`\n" in have, f"{face}.{name}"
    assert "class Plan(\n    index: Index,\n" in have  # a signature, one parameter a line when wide


def test_the_reference_is_made_without_tensorflow_or_torch():
    code = ("import sys, importlib.util; spec = importlib.util.spec_from_file_location('m', 'docs/make_api_md.py'); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.render(); "
            "print(sorted(x for x in ('tensorflow', 'keras', 'torch') if x in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("face", ["data", "plan", "records", "run", "report", "util", "commands", "tf", "torch"])
def test_each_subpackage_face_says_what_is_public_and_that_its_modules_are_internal(face):
    doc = " ".join(importlib.import_module(f"evenflow.{face}").__doc__.split())
    assert "Public:" in doc and "internal" in doc
