"""The ``evenflow`` command.

Every subcommand lives in its own module under :mod:`evenflow.commands` with two
functions, ``add_parser(subparsers)`` and ``run(args) -> int``; those modules import
their frameworks lazily, inside ``run``, so ``evenflow --help`` is instant.

Bad input (a ``ValueError``, ``TypeError`` or file error raised while running a
command) prints one line, ``evenflow <command>: error: <reason>``, and exits 2.
Set ``EVENFLOW_DEBUG=1`` to see the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> module; the order is the order of `evenflow --help`.
COMMANDS: dict[str, str] = {
    "demo": "evenflow.commands.demo",
    "train": "evenflow.commands.train",
    "launch": "evenflow.commands.launch",
    "inspect": "evenflow.commands.inspect",
    "convert": "evenflow.commands.convert",
    "index": "evenflow.commands.index",
    "audit": "evenflow.commands.audit",
    "report": "evenflow.commands.report",
}

EPILOG = """examples:
  evenflow demo                                   # digits, 4 replicas, MirroredStrategy
  evenflow inspect --samples 10000 --replicas 8 --batch-size 256 --weights 1,1,1,1,1,1,1,0.5
  evenflow train --config run.toml
  evenflow report runs/a                          # diagnosis + runs/a/report.html from the run's telemetry
  evenflow launch --workers 2 -- evenflow train --config run.toml   # 2 local MultiWorkerMirroredStrategy workers
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evenflow", description="Data-parallel training where every replica gets a fair, deterministic "
        "share of the samples at every step.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from evenflow.cli_flags import CommandParser

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue  # a command that is not built yet
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input)."""
    parser = _build_parser()
    args, extras = parser.parse_known_args(argv)
    if not getattr(args, "command", None):
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        parser.print_help()
        return 2
    if extras:  # the command's own usage and the flag meant, not the top-level usage
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].unrecognized(extras)
    _one_line_warnings(args.command)
    if getattr(args, "verbose", False):
        os.environ["EVENFLOW_VERBOSE"] = "1"  # read where TensorFlow is imported (and by child processes)
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "INFO")  # PyTorch's c10d and DDP info lines
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # here, where a reader that went away is handled, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        print(f"evenflow {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`evenflow audit RUN | head`): stop quietly, as Unix
        # tools do, with the status of a process ended by SIGPIPE. Standard output goes to
        # /dev/null so the interpreter's final flush does not complain about it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except ModuleNotFoundError as e:
        if "pip install" not in str(e) or os.environ.get("EVENFLOW_DEBUG"):
            raise  # not one of evenflow's optional packages, whose errors name what to install
        print(f"evenflow {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, KeyError) as e:
        if os.environ.get("EVENFLOW_DEBUG"):
            raise
        msg = str(e) if not isinstance(e, KeyError) else f"missing key {e}"
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"evenflow {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _one_line_warnings(command: str) -> None:
    """Show evenflow's warnings as ``evenflow <command>: warning: <message>``, without a source line."""
    import warnings

    ours = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def show(message, category, filename, lineno, file=None, line=None):
        if not os.path.abspath(str(filename)).startswith(ours):
            return shown(message, category, filename, lineno, file, line)
        print(f"evenflow {command}: warning: {message}", file=file or sys.stderr)

    shown = warnings.showwarning
    warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
