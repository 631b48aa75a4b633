"""Keep a framework's native start-up logging off the terminal, by the level the user chose.

TensorFlow's C++ libraries print a few lines while they load (an absl notice, "oneDNN custom
operations are on", CPU feature hints), some of them before TensorFlow reads
``TF_CPP_MIN_LOG_LEVEL``, so the variable alone does not hide them. While a framework is
imported, :func:`quiet_native_startup` points file descriptor 2 at a temporary file and then
writes back only the lines at or above the level: errors (``E``) and fatal errors (``F``) at
the default level 2, and every line that is not a log line (a Python warning, say). If the
import fails, everything it printed is written back, so nothing that explains a failure is lost.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

# absl / glog line prefixes: a severity letter and MMDD, e.g. "I0000 00:00:1795521979.41 ..."
_LOG_LINE = re.compile(r"^([IWEF])\d{4} ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def _level(value) -> int:
    try:
        return max(0, min(3, int(str(value).strip())))
    except ValueError:
        return 0


def shown_lines(text: str, level) -> str:
    """The lines of ``text`` that a native log level ``level`` (0-3) lets through.

    A log line is shown when its severity is at least ``level``; a line that does not start
    a log record continues the previous one and shares its fate, unless no record came
    before it (then it is shown). absl's ``WARNING: All log messages before
    absl::InitializeLog() ...`` notice counts as a warning.
    """
    level = _level(level)
    keep, current = [], None
    for line in text.splitlines(keepends=True):
        m = _LOG_LINE.match(line)
        if m:
            current = _SEVERITY[m[1]]
        elif line.startswith("WARNING: All log messages before absl::InitializeLog()"):
            current = _SEVERITY["W"]
        if current is None or current >= level:
            keep.append(line)
    return "".join(keep)


@contextlib.contextmanager
def quiet_native_startup(level):
    """Filter what the process writes to file descriptor 2 inside the block by ``level``."""
    if _level(level) == 0:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedding host): nothing to filter
        yield
        return
    ok = False
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
            ok = True
        finally:
            try:
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            out = shown_lines(text, level) if ok else text
            if out:
                sys.stderr.write(out)
                sys.stderr.flush()
