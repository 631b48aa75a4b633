"""Import PyTorch on first use, with an error that names the extra to install.

Everything under :mod:`evenflow.torch` that needs PyTorch calls :func:`torch`
inside a function body, never at module level, so that ``import evenflow.torch``
and ``evenflow --help`` stay instant and work without PyTorch installed.
"""
from __future__ import annotations

import importlib

# What the error of a missing PyTorch tells the user to run.
INSTALL_HINT = "pip install 'evenflow[torch]'"


class MissingFrameworkError(ImportError):
    """PyTorch is not installed in this environment."""


_MODULE = None


def torch():
    """The ``torch`` module (imported on the first call)."""
    global _MODULE
    if _MODULE is None:
        try:
            _MODULE = importlib.import_module("torch")
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.split(".")[0] == "torch":
                raise MissingFrameworkError(
                    f"evenflow.torch needs PyTorch, which is not installed; run {INSTALL_HINT} "
                    f"(it pins torch==2.13.0)") from e
            raise
    return _MODULE
