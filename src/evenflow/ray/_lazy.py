"""Import Ray on first use, with an error that names the extra to install.

Everything under :mod:`evenflow.ray` that needs Ray calls :func:`ray_train` inside a function body,
never at module level, so that ``import evenflow.ray`` and ``evenflow --help`` work without Ray.
"""
from __future__ import annotations

import importlib

# What the error of a missing Ray tells the user to run.
INSTALL_HINT = "pip install 'evenflow[ray]'"


class MissingRayError(ImportError):
    """Ray Train is not installed in this environment."""


def ray_train():
    """The ``ray.train`` module (Ray Train's reporting and checkpoint API)."""
    try:
        return importlib.import_module("ray.train")
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "ray":
            raise MissingRayError(f"evenflow.ray needs Ray Train, which is not installed; run {INSTALL_HINT}") from e
        raise
