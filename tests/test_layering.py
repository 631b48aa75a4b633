"""The layers of DESIGN.md, checked on the source: who imports whom, and no import cycle.

Every ``import`` and ``from ... import`` of every module under ``src/evenflow`` counts,
including the ones inside functions. ``import a.b`` is an edge to ``a.b``; ``from a.b
import c`` is an edge to ``a.b`` (its ``__init__`` runs) and, when ``a.b.c`` is a module,
to ``a.b.c`` too.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "evenflow"
FRAMEWORKS = {"tensorflow", "keras", "torch", "jax"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> tuple[set[str], set[str]]:
    """``(evenflow modules, other top-level names)`` that ``module`` imports, anywhere in its code."""
    inner, outer = set(), set()
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = _package(module).split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [(base, [a.name for a in node.names])]
        else:
            continue
        for name, names in targets:
            if name.split(".")[0] != ROOT:
                outer.add(name.split(".")[0])
                continue
            while name not in MODULES:  # "import evenflow.x.y" of a name inside a module: its module
                name = name.rpartition(".")[0]
            inner.add(name)
            inner.update(f"{name}.{n}" for n in names if f"{name}.{n}" in MODULES)
    inner.discard(module)
    return inner, outer


GRAPH = {m: _imports(m) for m in MODULES}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds a cycle."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v][0]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(MODULES)))
    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return comps


def _violations(package: str, allowed_inner: tuple[str, ...], allowed_outer: set[str] | None,
                forbidden_outer: set[str] = frozenset()) -> list[str]:
    bad = []
    for module, (inner, outer) in sorted(GRAPH.items()):
        if not _in(module, package):
            continue
        bad += [f"{module} imports {t}" for t in sorted(inner) if not any(_in(t, p) for p in allowed_inner)]
        if allowed_outer is not None:
            bad += [f"{module} imports {t}" for t in sorted(outer) if t not in allowed_outer]
        bad += [f"{module} imports {t}" for t in sorted(outer & forbidden_outer)]
    return bad


STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def test_the_graph_sees_every_module_and_function_level_imports():
    assert {"evenflow.plan.plan", "evenflow.records.dataset", "evenflow.data.load", "evenflow.tf.input.reader",
            "evenflow.torch.loader", "evenflow.util.files"} <= set(MODULES)
    # The package's __init__ imports the reader of Index.from_records inside a function only.
    assert "evenflow.data.records_index" in GRAPH["evenflow"][0]


def test_no_import_cycle():
    assert _cycles() == []


def test_plan_imports_numpy_and_the_stdlib_only():
    assert _violations("evenflow.plan", ("evenflow.plan", "evenflow.util"), STDLIB | {"numpy"}) == []


def test_records_imports_no_other_evenflow_package():
    allowed = STDLIB | {"numpy", "google", "google_crc32c", "fsspec"}  # fsspec: object storage, lazily
    assert _violations("evenflow.records", ("evenflow.records", "evenflow.util"), allowed) == []


def test_data_imports_no_framework():
    inner = ("evenflow.data", "evenflow.plan", "evenflow.records", "evenflow.util")
    assert _violations("evenflow.data", inner, None, FRAMEWORKS) == []


def test_run_imports_no_framework_and_no_adapter():
    inner = ("evenflow.run", "evenflow.data", "evenflow.plan", "evenflow.records", "evenflow.report", "evenflow.util")
    assert _violations("evenflow.run", inner, None, FRAMEWORKS) == []


def test_report_imports_the_plan_only():
    assert _violations("evenflow.report", ("evenflow.report", "evenflow.plan", "evenflow.util"), None,
                       FRAMEWORKS) == []


def test_ray_glue_imports_no_framework_and_no_adapter():
    """evenflow.ray (Ray Train glue) sits on the run layer like the adapters, and imports neither them nor a
    framework: the workers load the framework adapter by name."""
    inner = ("evenflow.ray", "evenflow.run", "evenflow.data", "evenflow.plan", "evenflow.records", "evenflow.report",
             "evenflow.util")
    assert _violations("evenflow.ray", inner, None, FRAMEWORKS) == []
    assert not any(_in(m, "evenflow.ray") for m, (inner, _) in GRAPH.items() for t in inner
                   if _in(t, "evenflow.ray") and not _in(m, "evenflow.ray") and not _in(m, "evenflow.commands"))


def test_util_imports_no_evenflow_package():
    assert _violations("evenflow.util", ("evenflow.util",), None) == []


@pytest.mark.parametrize("package,other,frameworks", [("evenflow.tf", "evenflow.torch", {"torch"}),
                                                      ("evenflow.torch", "evenflow.tf", {"tensorflow", "keras"})])
def test_framework_adapters_never_import_each_other(package, other, frameworks):
    bad = [f"{m} imports {t}" for m, (inner, outer) in sorted(GRAPH.items()) if _in(m, package)
           for t in sorted(inner | outer) if _in(t, other) or t in frameworks]
    assert bad == []


def test_submodules_never_import_their_own_package():
    bad = []
    for module, (inner, _) in sorted(GRAPH.items()):
        package = _package(module)
        if package == module:
            continue
        # The package itself and every enclosing package but the root, whose __init__ is the public API.
        owners = {package} | {p for p in inner if p != ROOT and _in(module, p) and p != module}
        bad += [f"{module} imports its package {p}" for p in sorted(owners & inner)]
    assert bad == []


def test_modules_and_functions_stay_small():
    """One concept per module (at most 400 lines: one concept may be one unit) and functions that fit on a screen (at most ~60)."""
    long_modules, long_functions = [], []
    for module, path in sorted(MODULES.items()):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_modules.append(f"{module}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 62:
                long_functions.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long_modules == [] and long_functions == []


# One class per framework under one name: each adapter's own, never a second class of a `data` or `plan` concept.
PER_FRAMEWORK = {"MissingFrameworkError", "PackedTextCNN", "Trainer"}


def test_one_class_per_public_name():
    """A public class name is defined in one module (DESIGN.md: "never a second ArraySource"), or once in
    evenflow.tf and once in evenflow.torch for the names of PER_FRAMEWORK."""
    where: dict[str, list[str]] = {}
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(module)
    twice = {name: modules for name, modules in where.items() if len(modules) > 1}
    per_framework = {name for name, modules in twice.items() if len(modules) == 2
                     and _in(modules[0], "evenflow.tf") and _in(modules[1], "evenflow.torch")}
    assert per_framework == PER_FRAMEWORK and {n: m for n, m in twice.items() if n not in per_framework} == {}


OPTION_FILES = ("run/options.py", "run/data_options.py")
# Public signatures that keep a default of their own for a parameter named like a run option, each a
# different concept that shares the name (kept short: everything else reads its default from the
# option dataclasses, or takes them whole). "file:function" -> the parameters, and why.
OWN_DEFAULTS = {
    # The plan contract (evenflow.Plan's seed, stratify, balance), forwarded to the plans these build.
    "tf/keras/fit.py:fit": {"seed", "stratify", "balance",
                            "epochs",      # model.fit's epochs=1: fit mirrors Keras's signature
                            "rebalance"},  # True/False or a RebalanceOptions, not MonitorOptions' on/off/auto
    "torch/dataset_loader.py:plan_loader": {"seed", "stratify"},
    "torch/batch_sampler.py:plan_sampler": {"seed", "stratify"},
    # How many epochs one tf.data pipeline streams (1), not how long a run trains.
    "tf/keras/data.py:keras_dataset": {"epochs"},
    "tf/input/packed.py:packed_dataset": {"epochs"},
    "tf/input/reader.py:worker_dataset": {"epochs"},
    # The tf.data conversions of sources (tf/input): an augment op's seed keys that op alone, a records
    # source's label key is a feature name of its files, and the text model's dropout is its own.
    "tf/input/augment.py:*": {"seed"},
    "tf/input/record_chain.py:__init__": {"seed"},
    "tf/input/records_source.py:__init__": {"label_key"},
    "tf/input/text.py:*": {"dropout"},
}


def _option_fields() -> tuple[set[str], set[str]]:
    """``(field names, class names)`` of the run's option dataclasses."""
    names, classes = set(), set()
    for rel in OPTION_FILES:
        for node in ast.parse((SRC / ROOT / rel).read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Options"):
                classes.add(node.name)
                names |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    return names, classes


def _restated_defaults() -> list[str]:
    """Parameters named like a run option, with a default that is not None and not read from its dataclass."""
    names, classes = _option_fields()
    found = []
    for package in ("run", "tf", "torch", "commands"):
        for path in sorted((SRC / ROOT / package).rglob("*.py")):
            rel = path.relative_to(SRC / ROOT).as_posix()
            if rel in OPTION_FILES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                positional = a.posonlyargs + a.args
                pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
                pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                allowed = OWN_DEFAULTS.get(f"{rel}:{node.name}", set()) | OWN_DEFAULTS.get(f"{rel}:*", set())
                for arg, default in pairs:
                    if arg.arg not in names or arg.arg in allowed:
                        continue
                    if isinstance(default, ast.Constant) and default.value is None:
                        continue  # "not given": the callee takes the dataclass's value, or the thing is absent
                    if (isinstance(default, ast.Attribute) and default.attr == arg.arg
                            and isinstance(default.value, ast.Name) and default.value.id in classes):
                        continue  # ComputeOptions.precision: the one default, read from its dataclass
                    found.append(f"{rel}:{node.name}({arg.arg}={ast.unparse(default)})")
    return found


def test_run_option_defaults_are_declared_once_in_their_dataclasses():
    """Options travel as their frozen dataclasses: no function restates a run option's default."""
    names, classes = _option_fields()
    assert {"skip_nonfinite", "accumulate_steps", "precision", "dropout", "seed", "epochs"} <= names
    assert {"ComputeOptions", "AnomalyOptions", "DataOptions"} <= classes
    assert _restated_defaults() == []


def test_only_the_package_faces_declare_a_public_list():
    """The public API is what the packages' ``__init__`` export; a module inside one is internal and has no ``__all__``."""
    listed = []
    for module, path in sorted(MODULES.items()):
        if path.name == "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                listed.append(module)
    assert listed == []
