"""Variable-length text as flat arrays, and ``stdlib-docs``: a real text dataset on every machine.

A :class:`TextData` holds N byte-tokenised sequences back to back: ``tokens`` is
one flat array of token ids and ``offsets[i]:offsets[i + 1]`` is sequence i (the
layout of a ragged tensor's row splits, and of Arrow's list arrays). Token ids are
bytes shifted by one — ``byte + 1`` in ``1..256`` — so 0 is free to mean padding
and a model can rebuild the token mask from the ids alone (vocabulary 257).

:func:`stdlib_docs` builds the dataset ``builtin:stdlib-docs`` without a download:
the docstrings of every function and class in the Python standard library's own
sources, read with :mod:`ast` in sorted file order (deterministic for a given
Python version), each labelled by its top-level module family — the 8 families
with the most docstrings, and "other". Lengths are long-tailed (a few dozen bytes
for most, thousands for some), the case cost balancing is for; the length is the
sample's cost.

numpy and the stdlib only: no framework import here.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass

import numpy as np

__all__ = ["TextData", "PAD", "VOCAB_SIZE", "stdlib_docs", "BUILTIN_TEXT", "encode"]

PAD = 0
VOCAB_SIZE = 257  # 256 byte values shifted by one, and the padding id 0
_FORMAT = 1  # bump when the parsing rules change, so old cache files are not used

# Folders of the standard library that are not the library itself: tests, demos, GUI tools,
# the bundled pip wheel and third-party packages.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
                        "ensurepip", "__pycache__", "tkinter", "venv"})


@dataclass(frozen=True, eq=False)
class TextData:
    """N variable-length token sequences with a label each.

    Attributes:
        tokens: uint16 ``[T]``, all sequences back to back; ids in ``1..256``.
        offsets: int64 ``[N + 1]``, sequence i is ``tokens[offsets[i]:offsets[i + 1]]``.
        labels: int64 ``[N]`` in ``0..K-1``.
        class_names: K names, ``class_names[k]`` for label k.
        name: short description for logs.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    name: str

    def __post_init__(self):
        n = self.labels.shape[0]
        if self.offsets.shape != (n + 1,) or self.offsets[0] != 0 or self.offsets[-1] != self.tokens.shape[0]:
            raise ValueError(f"offsets must have N + 1 = {n + 1} entries from 0 to len(tokens) "
                             f"= {self.tokens.shape[0]}, got {self.offsets.shape[0]} entries ending at "
                             f"{int(self.offsets[-1]) if self.offsets.size else None}")
        if np.any(np.diff(self.offsets) < 1):
            bad = int(np.flatnonzero(np.diff(self.offsets) < 1)[0])
            raise ValueError(f"every sequence needs at least one token, but sequence {bad} is empty; drop it")

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """int64 ``[N]``: tokens per sequence, the cost of each sample."""
        return np.diff(self.offsets)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def subset(self, ids: np.ndarray) -> "TextData":
        """The sequences ``ids`` in that order (ids int64 ``[M]``)."""
        ids = np.asarray(ids, dtype=np.int64)
        lengths = self.lengths[ids]
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[ids]
        # Position of every output token in the flat input: its sequence's start plus its rank in it.
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        tokens = self.tokens[np.repeat(starts, lengths) + within]
        return TextData(tokens, offsets, self.labels[ids], self.class_names, self.name)

    def padded(self, length: int | None = None) -> np.ndarray:
        """int32 ``[N, length]`` with 0 after each sequence (``length`` default: the longest)."""
        length = int(self.lengths.max()) if length is None else length
        out = np.zeros((self.num_samples, length), np.int32)
        for i in range(self.num_samples):
            seq = self.sequence(i)[:length]
            out[i, :len(seq)] = seq
        return out


def encode(text: str, max_len: int) -> np.ndarray:
    """UTF-8 bytes of ``text`` shifted to token ids ``1..256``, at most ``max_len`` of them (uint16)."""
    return np.frombuffer(text.encode("utf-8")[:max_len], dtype=np.uint8).astype(np.uint16) + 1


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
        with np.load(path, allow_pickle=False) as z:
            return TextData(z["tokens"], z["offsets"], z["labels"], tuple(str(c) for c in z["class_names"]),
                            str(z["name"]))
    except (OSError, ValueError, KeyError):
        return None  # absent, or unreadable: parse again


def _store_cached(path: str, data: TextData) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, tokens=data.tokens, offsets=data.offsets, labels=data.labels,
                     class_names=np.array(data.class_names), name=np.array(data.name))
        os.replace(tmp, path)  # readers see the whole file or none
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
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1 (bytes per docstring), got {max_len!r}")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ValueError(f"classes must be an int >= 1 (named module families), got {classes!r}")
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


def open_stdlib_docs(*, label_key=None, cost_key=None, feature_keys=None, image_format=None):
    """``builtin:stdlib-docs`` for ``evenflow convert``: one record per docstring.

    Each record holds ``text`` (the docstring's UTF-8 bytes, cut at 512 bytes: the
    token ids minus one) and the label; the cost column is the length in bytes
    (``cost_key`` ``"length"``, the default).
    """
    from evenflow.records.errors import RecordError
    from evenflow.records.example import ExampleEncoder, FeatureSpec
    from evenflow.records.sources import Source

    where = "builtin:stdlib-docs"
    if image_format is not None:
        raise RecordError(where, "--image-format only applies to builtin:digits", kind="input")
    if feature_keys and list(feature_keys) != ["text"]:
        raise RecordError(where, f"the only feature is 'text' (the docstring's bytes), got {list(feature_keys)}",
                          kind="feature")
    if cost_key not in (None, "length"):
        raise RecordError(where, f"--cost-key must be 'length' (bytes per docstring, the default), got {cost_key!r}",
                          kind="input")
    data = stdlib_docs()
    label_key = label_key or "label"
    specs = {"text": FeatureSpec("bytes", ()), label_key: FeatureSpec("int64", ())}
    encoder = ExampleEncoder(specs)

    def records(start: int, stop: int):
        for i in range(start, stop):
            text = (data.sequence(i) - 1).astype(np.uint8).tobytes()
            yield encoder.encode({"text": text, label_key: data.labels[i]}), None

    return Source(data.name, data.num_samples, specs, records, labels=data.labels,
                  costs=data.lengths.astype(np.float64), label_key=label_key, cost_key="length",
                  class_names=list(data.class_names))
