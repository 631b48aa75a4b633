"""Import TensorFlow and Keras on first use, with an error that names the extra to install.

Everything under :mod:`evenflow.tf` that needs TensorFlow calls :func:`tf` or
:func:`keras` inside a function body, never at module level, so that
``import evenflow`` and ``evenflow --help`` stay instant and work without
TensorFlow installed.
"""
from __future__ import annotations

import importlib
import os
import sys

from evenflow.util.framework_version import OLDEST_TENSORFLOW, too_old
from evenflow.util.native_log import quiet_native_startup

# What the error of a missing TensorFlow tells the user to run: `tf` installs the `tensorflow`
# distribution, `tf-cpu` the CPU-only `tensorflow-cpu` (docs/install.md).
INSTALL_HINT = "pip install 'evenflow[tf]' (or 'evenflow[tf-cpu]' for the CPU-only build)"
UPGRADE_HINT = (f"pip install -U 'tensorflow>={'.'.join(map(str, OLDEST_TENSORFLOW))},<3' (or tensorflow-cpu, "
                f"whichever of the two is installed)")


class MissingFrameworkError(ImportError):
    """TensorFlow (or Keras) is not installed in this environment, or is older than evenflow supports."""


_MODULES: dict = {}
_skip_extras = False  # set by skip_keras_extras()
# Packages Keras and TensorFlow import, when installed, only for what the CLI never does:
# scikit-learn for Keras's scikit-learn wrappers, matplotlib for keras.visualization's plots,
# pandas for DataFrame inputs to model.fit, SciPy for the legacy tf.keras sparse-matrix checks.
KERAS_EXTRAS = ("sklearn", "matplotlib", "pandas", "scipy")


def skip_keras_extras() -> None:
    """Import TensorFlow without the optional packages of :data:`KERAS_EXTRAS` (for the CLI's own process).

    Keras imports scikit-learn (its wrappers), matplotlib (``keras.visualization``) and pandas
    (``fit`` on a DataFrame), and TensorFlow's legacy Keras imports SciPy, whenever they are
    installed: together about a third of TensorFlow's import time. The CLI uses none of these
    paths, so it hides the packages not yet imported while TensorFlow is imported (each import is
    guarded, and Keras leaves that feature out) and shows them again afterwards: the CLI's own
    later imports of matplotlib or scikit-learn work as usual. A program that imports evenflow
    as a library is not affected.
    """
    global _skip_extras
    _skip_extras = True


def _import(name: str):
    module = _MODULES.get(name)
    if module is not None:
        return module
    # TensorFlow prints C++ start-up chatter (absl, oneDNN and CPU feature notices) at the
    # default level 0; evenflow runs it at level 2 (errors only) unless the user set a level, and
    # at level 0 when asked for --verbose. Some of those lines ignore the level, so the import's native
    # output is filtered by it too (see evenflow.util.native_log).
    if os.environ.get("EVENFLOW_VERBOSE"):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # asked for on the command line: it wins over the environment
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    hidden = [m for m in KERAS_EXTRAS if m not in sys.modules] if _skip_extras else []
    try:
        sys.modules.update(dict.fromkeys(hidden))  # a None entry makes `import m` fail at once
        with quiet_native_startup(os.environ["TF_CPP_MIN_LOG_LEVEL"]):
            module = importlib.import_module(name)
        installed = sys.modules.get("tensorflow")  # Keras imports it too
        refusal = too_old("TensorFlow", getattr(installed, "__version__", ""), OLDEST_TENSORFLOW, UPGRADE_HINT)
        if refusal:
            raise MissingFrameworkError(refusal)
        _MODULES[name] = module
        return module
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == name.split(".")[0]:
            raise MissingFrameworkError(
                f"evenflow.tf needs {name}, which is not installed; run {INSTALL_HINT}") from e
        raise
    finally:
        for m in hidden:
            sys.modules.pop(m, None)


# These two are called inside functions that tf.function / tf.data trace, and AutoGraph
# converts every function it meets: after the first call they must do nothing but a dict
# lookup, or AutoGraph warns about (and re-walks) importlib internals on every trace.
def tf():
    """The ``tensorflow`` module (imported on the first call)."""
    module = _MODULES.get("tensorflow")
    return module if module is not None else _import("tensorflow")


def keras():
    """The ``keras`` module (Keras 3, imported on the first call)."""
    module = _MODULES.get("keras")
    return module if module is not None else _import("keras")
