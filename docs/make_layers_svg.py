"""Draw docs/img/layers.svg: evenflow's packages as layers, each with its folders and their modules.

The picture is made from the source tree itself, so it cannot drift from it (tests/test_layering.py
checks that the file is what this script writes). Each row may import only the rows below it.

    python docs/make_layers_svg.py            # write docs/img/layers.svg
    python docs/make_layers_svg.py --check    # exit 1 if it is stale
"""
from __future__ import annotations

import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "evenflow"
OUT = ROOT / "docs" / "img" / "layers.svg"

# Bottom row first. Each package: what it is, in a few words.
ROWS = [
    [("util", "crash-safe writes, digests, progress")],
    [("plan", "the plan: numpy and the stdlib only"), ("records", "TFRecord files and their sidecars")],
    [("data", "the one Source family, loading, conversion"), ("report", "tables, telemetry, diagnosis")],
    [("run", "the framework-neutral run: options, loop, checkpoints, audit, monitor, adapter interface")],
    [("tf", "TensorFlow adapter"), ("torch", "PyTorch adapter"), ("ray", "Ray Train glue")],
    [("commands", "the evenflow command (cli.py, commands/): imports the rest lazily")],
]
WIDTH, ROW_H, PAD, LINE = 980, 118, 10, 15


def _folders(package: str) -> list[tuple[str, int]]:
    """``(folder, modules)`` of a package: its own modules first (as ``.``), then each subfolder."""
    base = SRC / package
    own = len([p for p in base.glob("*.py") if p.name != "__init__.py"])
    subs = sorted(p for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    return [(".", own)] + [(p.name + "/", len([q for q in p.glob("*.py") if q.name != "__init__.py"])) for p in subs]


def _box(x: float, y: float, w: float, name: str, what: str) -> list[str]:
    folders = _folders(name)
    total = sum(n for _, n in folders)
    out = [f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{ROW_H - PAD}" rx="6" class="box"/>',
           f'<text x="{x + 8:.0f}" y="{y + 18:.0f}" class="name">{escape(name)}/</text>',
           f'<text x="{x + 8 + 9 * len(name) + 14:.0f}" y="{y + 18:.0f}" class="what">{escape(what)} '
           f'({total} modules)</text>']
    per_line = max(1, int((w - 16) // 150))
    for i, (folder, count) in enumerate(folders):
        col, row = i % per_line, i // per_line
        label = f"{folder} {count}" if folder != "." else f"(top) {count}"
        out.append(f'<text x="{x + 12 + col * 150:.0f}" y="{y + 40 + row * LINE:.0f}" class="folder">'
                   f'{escape(label)}</text>')
    return out


def render() -> str:
    height = len(ROWS) * ROW_H + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Arial, sans-serif">',
             "<style>.box{fill:#f4f6fa;stroke:#4a5a7a;stroke-width:1.2}.name{font-size:15px;font-weight:bold;"
             "fill:#1d2a44}.what{font-size:12px;fill:#44506a}.folder{font-size:12px;fill:#1d2a44}"
             ".note{font-size:12px;fill:#44506a}</style>",
             f'<text x="{PAD}" y="22" class="note">src/evenflow: each row imports only the rows below it; '
             f'a folder\'s number is its modules. tf/ and torch/ never import each other.</text>']
    for level, row in enumerate(ROWS):
        y = 34 + (len(ROWS) - 1 - level) * ROW_H
        w = (WIDTH - PAD * (len(row) + 1)) / len(row)
        for i, (name, what) in enumerate(row):
            parts += _box(PAD + i * (w + PAD), y, w, name, what)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python docs/make_layers_svg.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
