"""Import PyTorch on first use, with an error that names the extra to install.

Everything under :mod:`evenflow.torch` that needs PyTorch calls :func:`torch`
inside a function body, never at module level, so that ``import evenflow.torch``
and ``evenflow --help`` stay instant and work without PyTorch installed.
"""
from __future__ import annotations

import importlib

from evenflow.util.framework_version import OLDEST_TORCH, too_old

# What the error of a missing PyTorch tells the user to run.
INSTALL_HINT = "pip install 'evenflow[torch]'"
UPGRADE_HINT = f"pip install -U 'torch>={'.'.join(map(str, OLDEST_TORCH))}' (from the index of your CUDA or CPU build)"


class MissingFrameworkError(ImportError):
    """PyTorch is not installed in this environment, or is older than evenflow supports."""


_MODULE = None


def torch():
    """The ``torch`` module (imported on the first call)."""
    global _MODULE
    if _MODULE is None:
        try:
            module = importlib.import_module("torch")
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.split(".")[0] == "torch":
                raise MissingFrameworkError(
                    f"evenflow.torch needs PyTorch, which is not installed; run {INSTALL_HINT} "
                    f"(it keeps the torch build already installed)") from e
            raise
        refusal = too_old("PyTorch", getattr(module, "__version__", ""), OLDEST_TORCH, UPGRADE_HINT)
        if refusal:
            raise MissingFrameworkError(refusal)
        _MODULE = module
    return _MODULE
