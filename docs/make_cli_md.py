"""Write docs/cli.md, the reference of every ``evenflow`` command and flag, from the real argparse parsers.

    python docs/make_cli_md.py            # rewrite docs/cli.md
    python docs/make_cli_md.py --check    # exit 1 when docs/cli.md differs from what the parsers give now

Run it after changing a command's flags or help; the test suite fails while docs/cli.md is stale.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "cli.md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    takes_value = action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)
    if takes_value:
        metavar = action.metavar or action.dest.upper()
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        if action.nargs == "?":
            metavar = f"[{metavar}]"
        elif action.nargs in ("*", "+"):
            metavar = f"{metavar} ..."
        names = f"{names} {metavar}"
    return f"`{names}`"


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, argparse.SUPPRESS) or not action.option_strings:
        return ""
    if isinstance(action.default, bool) and action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
        return "off" if action.default is False else "on"
    return f"`{action.default}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=prog)
        params = {k: (v.__name__ if hasattr(v, "__name__") else v) for k, v in params.items()}
        text = text % params
    return _cell(text)


def render() -> str:
    """The text of docs/cli.md for the parsers of this checkout."""
    from evenflow import cli

    parser = cli._build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = ["# Command-line reference", "",
             "Every `evenflow` command and flag, generated from the command's own parsers by "
             "`python docs/make_cli_md.py` (the test suite fails when this page is stale). "
             "`evenflow COMMAND --help` prints the same. Every command exits 0 on success and 2 on bad input, "
             "with one line that names the value and the fix.", ""]
    lines += [f"- [`evenflow {name}`](#evenflow-{name}): {_cell(choice.help or '')}"
              for choice, name in ((c, c.dest) for c in sub._choices_actions)]
    lines += ["", "Examples:", "", "```text", cli.EPILOG.strip().removeprefix("examples:").strip("\n"), "```"]
    for name, p in sub.choices.items():
        lines += ["", f"## evenflow {name}", ""]
        if p.description:
            lines += [p.description.strip(), ""]
        rows = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
        lines += ["| argument | default | what it does |", "|---|---|---|"]
        lines += [f"| {_flag(a)} | {_default(a)} | {_help(a, p.prog)} |" for a in rows]
        if p.epilog:
            lines += ["", "```text", p.epilog.strip("\n"), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generated_page import write_or_check

    return write_or_check(OUT, render, "the evenflow command's argparse parsers", argv)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
