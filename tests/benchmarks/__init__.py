"""Smoke tests of the scripts in benchmarks/, each loaded as a module by :func:`load`."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    """``benchmarks/<name>.py`` as a module (the scripts are plain files, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
