"""``builtin:stdlib-docs``: a real text dataset on every machine, without a download.

:func:`stdlib_docs` reads the docstrings of every function and class in the Python
standard library's own sources with :mod:`ast`, in sorted file order (deterministic for a
given Python version), each labelled by its top-level module family: the 8 families with
the most docstrings, and "other". Lengths are long-tailed (a few dozen bytes for most,
thousands for some), the case cost balancing is for; the length is the sample's cost.
The result is a :class:`~evenflow.data.text.TextData`, cached on disk per Python build.

numpy and the stdlib only: no framework import here.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import os
import sys
import sysconfig
from collections import Counter

import numpy as np

from evenflow.data.text import TextData, encode
from evenflow.util.files import NPZ_READ_ERRORS, read_npz, write_atomic
from evenflow.util.validate import check_int

_FORMAT = 1  # bump when the parsing rules change, so old cache files are not used

# Folders of the standard library that are not the library itself: tests, demos, GUI tools,
# the bundled pip wheel and third-party packages.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
                        "ensurepip", "__pycache__", "tkinter", "venv"})


def _stdlib_files(root: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if any(p in _SKIP_DIRS or p.startswith("config-") for p in parts):
            dirs[:] = []
            continue
        dirs.sort()  # os.walk's order is the file system's; sorting makes it the same everywhere
        found += [os.path.join(*parts, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _family(rel_path: str) -> str:
    top = rel_path.split(os.sep)[0]
    return top[:-3] if top.endswith(".py") else top


def _cache_file(max_len: int, classes: int) -> str | None:
    """Where a parsed ``stdlib-docs`` is kept: one file per Python build, stdlib path and options."""
    base = os.environ.get("EVENFLOW_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "evenflow")
    key = f"{_FORMAT}|{sys.version}|{sysconfig.get_paths()['stdlib']}|{max_len}|{classes}"
    return os.path.join(base, f"stdlib-docs-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz")


def _load_cached(path: str) -> TextData | None:
    try:
        z = read_npz(path)
        return TextData(z["tokens"], z["offsets"], z["labels"], tuple(str(c) for c in z["class_names"]),
                        str(z["name"]))
    except NPZ_READ_ERRORS:
        return None  # absent, or unreadable: parse again


def _store_cached(path: str, data: TextData) -> None:
    buf = io.BytesIO()
    np.savez(buf, tokens=data.tokens, offsets=data.offsets, labels=data.labels,
             class_names=np.array(data.class_names), name=np.array(data.name))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, buf.getvalue())  # readers see the whole file or none
    except OSError:
        pass  # a read-only home: the next run parses again


@functools.lru_cache(maxsize=4)
def stdlib_docs(max_len: int = 512, classes: int = 8, cache: bool = True) -> TextData:
    """Docstrings of the standard library's functions and classes, labelled by module family.

    Args:
        max_len: keep at most this many bytes of each docstring (>= 1); longer ones
            are cut, which caps the longest sample's cost.
        classes: number of named families (the commonest); every other family is
            the last label, ``"other"``.
        cache: keep the parsed arrays in ``$EVENFLOW_CACHE_DIR`` (default
            ``~/.cache/evenflow``), keyed by the Python build and the options, and
            read them from there next time (parsing takes ~5 s, reading ~0.05 s).

    Returns:
        A :class:`TextData` (about 6,400 sequences on CPython 3.11).
    """
    max_len = check_int("max_len", max_len, 1, fix="bytes per docstring, e.g. 256")
    classes = check_int("classes", classes, 1, fix="named module families, e.g. 8")
    path = _cache_file(max_len, classes) if cache else None
    data = _load_cached(path) if path else None
    if data is None:
        data = _parse_stdlib_docs(max_len, classes)
        if path:
            _store_cached(path, data)
    return data


def _parse_stdlib_docs(max_len: int, classes: int) -> TextData:
    root = sysconfig.get_paths()["stdlib"]
    docs: list[tuple[str, str]] = []
    for rel in _stdlib_files(root):
        try:
            with open(os.path.join(root, rel), "rb") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, ValueError, OSError):
            continue  # a file this Python cannot parse (e.g. a deliberately broken fixture)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and doc.strip():
                    docs.append((_family(rel), doc))
    if not docs:
        raise ValueError(f"found no docstrings under the standard library at {root}; this Python installation "
                         f"ships without its .py sources, so builtin:stdlib-docs is unavailable")
    counts = Counter(fam for fam, _ in docs)
    # Ties broken by name so the label set is the same on every machine with this Python.
    names = [fam for fam, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:classes]]
    code = {fam: k for k, fam in enumerate(names)}
    seqs = [encode(doc, max_len) for _, doc in docs]
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    labels = np.array([code.get(fam, len(names)) for fam, _ in docs], np.int64)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return TextData(np.concatenate(seqs), offsets, labels, (*names, "other"),
                    f"builtin:stdlib-docs (Python {version} docstrings, max_len {max_len})")


BUILTIN_TEXT = {"stdlib-docs": stdlib_docs}
