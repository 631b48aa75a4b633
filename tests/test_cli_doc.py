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


def test_help_lists_the_choices_and_shows_no_rest_markup():
    import subprocess
    import sys

    from evenflow.run.options import CHOICES

    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    helps = {name: subprocess.run([sys.executable, "-m", "evenflow", name, "--help"], capture_output=True, text=True,
                                  env=env, timeout=60).stdout
             for name in ("demo", "train", "launch", "inspect", "convert", "index", "audit", "report")}
    for name, text in helps.items():
        assert text and "``" not in text, (name, text[:300])
    for key, words in CHOICES.items():  # `--balance {count,cost}`, the words the options accept
        assert f"--{key.replace('_', '-')} {{{','.join(words)}}}" in helps["train"], key
    assert "--balance {count,cost}" in helps["inspect"]
