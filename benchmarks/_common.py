"""What every benchmark script shares: a record of the machine and code, and writing the result."""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent


def _git(*cmd: str) -> str:
    try:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(**extra) -> dict:
    """Where and on which code the benchmark ran (the plan code may hold uncommitted edits)."""
    return {"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "git_commit": _git("rev-parse", "--short", "HEAD"),
            "plan_code_dirty": bool(_git("status", "--porcelain", "--", "../src/evenflow/plan")), **extra}


def write_result(result: dict, table: str, path: Path) -> dict:
    """Print the table, write the result as JSON to ``path`` and say where."""
    print(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return result


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group or a local server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
