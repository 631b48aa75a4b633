"""Flags shared by several ``evenflow`` subcommands."""
from __future__ import annotations

import argparse

__all__ = ["add_verbose_flag"]


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: let the frameworks' own native logging through (default: errors only)."""
    parser.add_argument("--verbose", action="store_true", default=False,
                        help="show the frameworks' native info logging too: TensorFlow's C++ start-up lines (default: "
                             "its errors only, unless TF_CPP_MIN_LOG_LEVEL is set) and PyTorch's c10d/DDP lines")
