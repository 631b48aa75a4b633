"""Flags shared by several ``evenflow`` subcommands."""
from __future__ import annotations

import argparse

__all__ = ["add_verbose_flag"]


def add_verbose_flag(parser: argparse.ArgumentParser, whose: str = "the ") -> None:
    """``--verbose``: let the frameworks' own native logging through (default: errors only).

    It sets ``EVENFLOW_VERBOSE=1`` in the environment, which the processes a command starts inherit
    (``evenflow launch --verbose`` passes it to every worker).
    """
    parser.add_argument("--verbose", action="store_true", default=False,
                        help=f"show {whose}frameworks' native info logging too: TensorFlow's C++ start-up lines (default: "
                             "its errors only, unless TF_CPP_MIN_LOG_LEVEL is set) and PyTorch's c10d/DDP lines")
