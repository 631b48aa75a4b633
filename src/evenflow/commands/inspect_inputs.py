"""``evenflow inspect``'s inputs: its numbers checked first, a column of labels or costs from a file,
``--weights`` and ``--steps``, and the plan's errors in the command's own words (its flags, not the Python
arguments behind them).

:func:`check_numbers` and :func:`check_replicas_fit` apply `evenflow train`'s limits, in its words, before
anything is read or allocated: a global batch of at least one sample per replica and at most
:data:`~evenflow.util.validate.MAX_GLOBAL_BATCH`, a seed in ``[0, MAX_SEED]``, and at least as many samples as
replicas; and one of inspect's own, at most :data:`MAX_REPLICAS` replicas (a row each in the summary)."""
from __future__ import annotations

import os

import numpy as np

from evenflow.util.files import NUMPY_FILE_KINDS, numpy_file_kind
from evenflow.util.validate import MAX_GLOBAL_BATCH, MAX_SEED, check_int

# The most replicas inspect plans: its summary holds a row per replica (a million rows take half a minute
# and a GiB or more), and more data-parallel replicas than this is no cluster's topology.
MAX_REPLICAS = 65_536

# The most samples: 2**53, the largest count the plan's step arithmetic (float64 in part) holds exactly.
MAX_SAMPLES = 2**53

# What the plan says of its arguments, and what the command calls them.
_FLAGS = (("num_samples must", "--samples must"), ("global_batch_size must", "--batch-size must"),
          ("stratify=True needs labels, but the index has none; build the Index with labels=... or turn stratify off",
           "--stratify needs labels: pass --labels FILE, or a --dataset with labels"),
          ("bucket=True needs costs, but the index has none; build the Index with costs=... (e.g. sequence lengths) "
           "or turn bucket off", "--bucket needs costs: pass --costs FILE (e.g. sequence lengths), or a --dataset"),
          ("Index costs", "--costs"), ("Index labels", "--labels"), ("replicas must", "--replicas must"),
          ("weights must", "--weights must"), ("every weight must", "--weights: every weight must"),
          ("seed must", "--seed must"), ("epoch must", "--epoch must"), ("pack must", "--pack must"))


def check_numbers(args) -> None:
    """Refuse counts `evenflow train` would refuse, and more replicas than :data:`MAX_REPLICAS`, before any
    file is read or any array allocated: each message names the flag, the value and the limit."""
    r = check_int("--replicas", args.replicas, 1)
    g = check_int("--batch-size", args.batch_size, 1, MAX_GLOBAL_BATCH, fix="samples per step, as in evenflow train")
    if g < r:
        raise ValueError(f"--batch-size must be at least the number of replicas so every replica gets a sample in "
                         f"each full step: --batch-size is {g:,} and --replicas is {r:,}; use a global batch size of "
                         f"at least {r:,} (a multiple of {r:,} is best) or fewer replicas")
    check_int("--seed", args.seed, 0, MAX_SEED, fix="as in evenflow train")
    check_int("--epoch", args.epoch, 0, fix="the first epoch is 0")
    if args.samples is not None:
        check_int("--samples", args.samples, 1, MAX_SAMPLES, fix="2**53, the most the plan counts exactly")
        check_replicas_fit(args.samples, r, "--samples gives")
    check_int("--replicas", r, 1, MAX_REPLICAS, fix="inspect summarises each replica on a row of its own "
              "(e.g. --replicas 4096)")
    check_int("--pack", args.pack, 0, fix="a number of tokens; 0: no packing")
    if args.bucket_window is not None:
        check_int("--bucket-window", args.bucket_window, 1, fix="a number of steps")


def check_replicas_fit(num_samples: int, replicas: int, source: str) -> None:
    """`evenflow train`'s rule: at least as many samples as replicas (``source``: e.g. ``"labels.npy holds"``)."""
    if num_samples < replicas:
        raise ValueError(f"{source} {num_samples:,} samples but --replicas is {replicas:,}: some replicas would "
                         f"train on nothing but padding in every step; use at most {num_samples:,} replicas or a "
                         f"larger dataset")


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
