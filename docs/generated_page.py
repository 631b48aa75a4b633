"""The command line shared by the docs pages made from the code (cli.md, api.md): write the page, or check it."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def write_or_check(out: Path, render: Callable[[], str], source: str, argv: list[str] | None = None) -> int:
    """Write ``out`` from ``render()``, or with ``--check`` only compare (exit 1 when it is stale)."""
    script = f"python docs/make_{out.stem}_md.py"
    ap = argparse.ArgumentParser(description=f"Write docs/{out.name} from {source}.")
    ap.add_argument("--check", action="store_true", help=f"only compare; exit 1 when docs/{out.name} is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else f'stale; run {script}'}")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out} ({text.count(chr(10))} lines)")
    return 0
