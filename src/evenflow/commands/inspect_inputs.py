"""``evenflow inspect``'s inputs: a column of labels or costs from a file, ``--weights`` and ``--steps``,
and the plan's errors in the command's own words (its flags, not the Python arguments behind them)."""
from __future__ import annotations

import os

import numpy as np

from evenflow.util.files import NUMPY_FILE_KINDS, numpy_file_kind

__all__ = ["load_column", "parse_weights", "parse_steps", "in_flags"]

# What the plan says of its arguments, and what the command calls them.
_FLAGS = (("num_samples must", "--samples must"), ("global_batch_size must", "--batch-size must"),
          ("stratify=True needs labels, but the index has none; build the Index with labels=... or turn stratify off",
           "--stratify needs labels: pass --labels FILE, or a --dataset with labels"),
          ("bucket=True needs costs, but the index has none; build the Index with costs=... (e.g. sequence lengths) "
           "or turn bucket off", "--bucket needs costs: pass --costs FILE (e.g. sequence lengths), or a --dataset"),
          ("Index costs", "--costs"), ("Index labels", "--labels"))


def in_flags(message: str) -> str:
    """A plan error as ``evenflow inspect`` says it: its flags in place of the Python names."""
    for python, flag in _FLAGS:
        message = message.replace(python, flag)
    return message


def load_column(path: str, what: str, integer: bool) -> np.ndarray:
    """Read an .npy array (known by its header, whatever the file's name) or a text file with one number per line."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} file {path} {'is a directory' if os.path.isdir(path) else 'does not exist'}; "
                         f"pass a .npy file or a text file with one number per line")
    kind = numpy_file_kind(path)  # by content: np.load would take any file without a header for a pickle
    if kind == "npy":
        try:  # memory-mapped: a window of a huge epoch reads the values it needs
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{what} file {path} is not a numeric .npy array ({e})") from e
        if sum(n > 1 for n in arr.shape) > 1:
            raise ValueError(f"{what} file {path} holds an array of shape {arr.shape}; pass one value per sample, "
                             f"a 1-d array of shape (N,)")
    elif kind == "npz" or path.endswith(".npy"):
        raise ValueError(f"{what} file {path} is {NUMPY_FILE_KINDS[kind]}{', not an .npy array' if kind == 'npz' else ''}"
                         f"; save the {what} alone with numpy.save, or write one number per line in a text file")
    else:
        values = []
        try:
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        values.append(float(line))
                    except ValueError:
                        raise ValueError(f"{what} file {path}, line {line_no}: {line[:40]!r} is not a number; "
                                         f"write one number per line") from None
        except UnicodeDecodeError:
            raise ValueError(f"{what} file {path} is neither an .npy array nor UTF-8 text; save the {what} with "
                             f"numpy.save, or write one number per line") from None
        arr = np.asarray(values, dtype=np.float64)
    arr = np.ravel(arr)
    if integer and arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.round(arr)):
            raise ValueError(f"{what} file {path} must hold whole numbers (class ids)")
        arr = arr.astype(np.int64)
    return arr


def parse_weights(text: str | None):
    if not text:
        return None
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--weights must be comma-separated numbers like 1,1,1,0.5, got {text!r}") from None


def parse_steps(text: str, total: int) -> tuple[int, int]:
    """``--steps A:B`` (either end may be left out) as steps ``(first, last)`` of an epoch of ``total`` steps."""
    a, sep, b = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        first, last = (int(a) if a.strip() else 0), (int(b) if b.strip() else total)
    except ValueError:
        raise ValueError(f"--steps must be A:B with whole numbers (steps A to B-1; A: or :B for an open end), "
                         f"got {text!r}; e.g. --steps 0:8") from None
    if not 0 <= first < last <= total:
        raise ValueError(f"--steps must name at least one of the epoch's {total:,} steps (0 <= A < B <= {total}), "
                         f"got {text!r}; e.g. --steps 0:{min(total, 8)}")
    return first, last
