"""Flags shared by several ``evenflow`` subcommands."""
from __future__ import annotations

import argparse
import math
import re
import sys

# argparse's words for a value its ``type`` refused: "argument --replicas: invalid int value: '1e9'".
_BAD_NUMBER = re.compile(r"argument (?P<flags>[^: ]+): invalid (?P<kind>int|float) value: '(?P<value>.*)'$")


class CommandParser(argparse.ArgumentParser):
    """The parser of an ``evenflow`` subcommand: a flag value that is not a number of its kind is one line.

    ``evenflow inspect --replicas 1e9`` says ``evenflow inspect: error: --replicas takes a whole number, got
    '1e9'; write it in digits, e.g. --replicas 1000000000`` and exits 2, without the usage text that
    argparse prints before its other errors.
    """

    def parse_known_args(self, args=None, namespace=None):
        self._given = [a.split("=", 1)[0] for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        bad = _BAD_NUMBER.match(message)
        if bad is None:
            super().error(message)
        names = bad["flags"].split("/")  # a flag with aliases: the name as this command line gave it
        flag = next((n for n in names if n in getattr(self, "_given", ())), names[0])
        kind, value = bad["kind"], bad["value"]
        self.exit(2, f"{self.prog}: error: {flag} takes {_fix(flag, kind, value)}\n")


    def unrecognized(self, extras: list[str]):
        """Refuse arguments the command does not take, with its own usage and the flag meant, if one is close."""
        import difflib

        options = sorted({o for a in self._actions for o in a.option_strings if o.startswith("--")})
        hints = []
        for arg in extras:
            name = arg.split("=", 1)[0]
            if name.startswith("-"):
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
                if close:
                    hints.append(f"did you mean {close[0]}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}; see {self.prog} --help")


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


def help_description(doc: str) -> str:
    """A command module's docstring as its ``--help`` description: the reST literals (two backticks) shown with one."""
    return doc.replace("``", "`")


def add_verbose_flag(parser: argparse.ArgumentParser, whose: str = "the ") -> None:
    """``--verbose``: let the frameworks' own native logging through (default: errors only), and let every
    process of a multi-process run print (default: process 0 only, errors on all).

    It sets ``EVENFLOW_VERBOSE=1`` in the environment, which the processes a command starts inherit
    (``evenflow launch --verbose`` passes it to every worker).
    """
    parser.add_argument("--verbose", action="store_true", default=False,
                        help=f"show {whose}frameworks' native info logging too: TensorFlow's C++ start-up lines (default: "
                             "its errors only, unless TF_CPP_MIN_LOG_LEVEL is set) and PyTorch's c10d/DDP lines; and "
                             "let every process of a multi-process run print its progress and results (default: "
                             "process 0 only; errors on every process)")


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir`` and ``--cache-size``: the block cache of shards read from object storage."""
    parser.add_argument("--cache-dir", metavar="DIR", default=None,
                        help="object-store data (s3://, gs://, ...): the block cache folder (default "
                             "$EVENFLOW_CACHE_DIR, else ~/.cache/evenflow)")
    parser.add_argument("--cache-size", metavar="SIZE", default=None,
                        help="object-store data: the block cache's size limit, e.g. 500M or 20G; least recently "
                             "used objects are evicted down to it, except those the run has open: a dataset larger "
                             "than the limit overshoots it while read, with a warning (default "
                             "$EVENFLOW_CACHE_SIZE, else 20G)")


def use_cache_flags(args) -> None:
    """Set ``EVENFLOW_CACHE_DIR`` / ``EVENFLOW_CACHE_SIZE`` from the flags given, for this command and the
    processes it starts (the workers of a run read the same cache).

    Raises:
        ValueError: a ``--cache-size`` that is not a size, or a ``--cache-dir`` that is a file.
    """
    import os

    from evenflow.records.remote.options import parse_size
    if getattr(args, "cache_size", None) is not None:
        parse_size(args.cache_size, "--cache-size")
        os.environ["EVENFLOW_CACHE_SIZE"] = args.cache_size
    if getattr(args, "cache_dir", None) is not None:
        if os.path.isfile(args.cache_dir):
            raise ValueError(f"--cache-dir {args.cache_dir} is a file; pass a folder (it is created if missing)")
        os.environ["EVENFLOW_CACHE_DIR"] = os.path.abspath(args.cache_dir)


def cache_flags_for(args, dataset) -> None:
    """Use the cache flags for ``dataset``, or refuse them (exit 2) when it is not in object storage.

    Raises:
        ValueError: a cache flag given for local data (nothing accepted is ignored), or a bad value.
    """
    from evenflow.records.remote.url import is_url
    given = [f for f, k in (("--cache-dir", "cache_dir"), ("--cache-size", "cache_size"))
             if getattr(args, k, None) is not None]
    if given and not is_url(str(dataset)):
        raise ValueError(f"{given[0]} applies to data in object storage (s3://, gs://, ...), and the data "
                         f"{dataset} is local: drop {given[0]}")
    use_cache_flags(args)
