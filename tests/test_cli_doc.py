"""docs/cli.md is what docs/make_cli_md.py makes from the evenflow command's argparse parsers today."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("make_cli_md", ROOT / "docs" / "make_cli_md.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    want = module.render()
    have = (ROOT / "docs" / "cli.md").read_text()
    assert have == want, "docs/cli.md is stale: run `python docs/make_cli_md.py` and commit the result"
    # Every subcommand has its section, with its flags as the parser defines them.
    for name in ("demo", "train", "launch", "inspect", "convert", "index", "audit", "report"):
        assert f"## evenflow {name}\n" in have
    assert "`--collective-timeout" in have and "`--workers N`" in have
