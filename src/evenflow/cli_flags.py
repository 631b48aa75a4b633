"""Flags shared by several ``evenflow`` subcommands."""
from __future__ import annotations

import argparse
import math
import re

# argparse's words for a value its ``type`` refused: "argument --replicas: invalid int value: '1e9'".
_BAD_NUMBER = re.compile(r"argument (?P<flag>[^:/ ]+)(?:/[^:]+)?: invalid (?P<kind>int|float) value: '(?P<value>.*)'$")


class CommandParser(argparse.ArgumentParser):
    """The parser of an ``evenflow`` subcommand: a flag value that is not a number of its kind is one line.

    ``evenflow inspect --replicas 1e9`` says ``evenflow inspect: error: --replicas takes a whole number, got
    '1e9'; write it in digits, e.g. --replicas 1000000000`` and exits 2, without the usage text that
    argparse prints before its other errors.
    """

    def error(self, message: str):
        bad = _BAD_NUMBER.match(message)
        if bad is None:
            super().error(message)
        flag, kind, value = bad["flag"], bad["kind"], bad["value"]
        self.exit(2, f"{self.prog}: error: {flag} takes {_fix(flag, kind, value)}\n")


def _fix(flag: str, kind: str, value: str) -> str:
    if kind == "float":
        return f"a number, got {value!r}; write one such as 0.5 or 1e-3"
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isfinite(number) and number == int(number):
        return f"a whole number, got {value!r}; write it in digits, e.g. {flag} {int(number)}"
    return f"a whole number, got {value!r}; write one without a decimal point or exponent"


def add_verbose_flag(parser: argparse.ArgumentParser, whose: str = "the ") -> None:
    """``--verbose``: let the frameworks' own native logging through (default: errors only).

    It sets ``EVENFLOW_VERBOSE=1`` in the environment, which the processes a command starts inherit
    (``evenflow launch --verbose`` passes it to every worker).
    """
    parser.add_argument("--verbose", action="store_true", default=False,
                        help=f"show {whose}frameworks' native info logging too: TensorFlow's C++ start-up lines (default: "
                             "its errors only, unless TF_CPP_MIN_LOG_LEVEL is set) and PyTorch's c10d/DDP lines")
