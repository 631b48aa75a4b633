"""The pages a reader follows: every relative link of README.md, CHANGELOG.md and docs/*.md leads
somewhere, down to its #anchor, and the pages keep the shape they promise."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces as hyphens) and ``<a id="...">``."""
    text = FENCE.sub("", page.read_text())
    heads = re.findall(r"^#{1,6} (.+)$", text, re.M)
    ids = set(re.findall(r'<a id="([^"]+)">', text))
    return ids | {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading '#{anchor}' in {dest.name})")
    assert not broken, "\n".join(broken)


def test_the_pages_keep_their_shape():
    readme = (ROOT / "README.md").read_text()
    for must in ("](docs/api.md)", "](CHANGELOG.md)", "## When not to use evenflow", "Python 3.10"):
        assert must in readme, must
    lines = len((ROOT / "docs" / "benchmarks.md").read_text().splitlines())
    assert lines <= 600, f"docs/benchmarks.md has {lines} lines: it holds each benchmark's current figure, <= 600"
