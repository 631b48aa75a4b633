"""Where remote shards are cached and how long a store may stall: :class:`StoreOptions`, from the environment.

=========================== =========================================== ====================
variable                    what                                        default
=========================== =========================================== ====================
``EVENFLOW_CACHE_DIR``      the block cache folder                      ``~/.cache/evenflow``
                                                                        (``$XDG_CACHE_HOME``)
``EVENFLOW_CACHE_SIZE``     its size limit (``500M``, ``20G``)          ``20G``
``EVENFLOW_BLOCK_SIZE``     bytes per ranged read and cached block      ``16M``
``EVENFLOW_STORE_TIMEOUT``  seconds one request may take                ``20``
``EVENFLOW_STORE_DEADLINE`` seconds a read may keep retrying            ``120``
=========================== =========================================== ====================

The CLI's ``--cache-dir`` and ``--cache-size`` set the first two for the command and the
processes it starts.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """Bytes of ``500M``, ``20G``, ``1.5T`` or a plain number of bytes.

    Raises:
        ValueError: one line naming ``what`` and the value.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{what} must be a positive size such as 500M or 20G, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {text!r}")
    return value


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "evenflow")


@dataclass(frozen=True)
class StoreOptions:
    """How remote shards are read.

    Attributes:
        cache_dir: the block cache folder (shared by every process of the machine).
        cache_bytes: its size limit: least recently used objects are evicted down to it, but
            never the objects this process has open (every block an open dataset fetched
            stays until it is closed, so data read at once that is larger than the limit
            overshoots it, with a warning).
        block_bytes: the unit of ranged reads and of the cache.
        timeout_s: seconds one request may take before it is retried.
        deadline_s: seconds a read may keep retrying before it fails.
    """

    cache_dir: str
    cache_bytes: int = 20 << 30
    block_bytes: int = 16 << 20
    timeout_s: float = 20.0
    deadline_s: float = 120.0

    @classmethod
    def from_env(cls) -> "StoreOptions":
        """The options the ``EVENFLOW_*`` variables of the module docstring give."""
        env = os.environ.get
        return cls(cache_dir=os.path.abspath(os.path.expanduser(env("EVENFLOW_CACHE_DIR") or default_cache_dir())),
                   cache_bytes=parse_size(env("EVENFLOW_CACHE_SIZE", "20G"), "EVENFLOW_CACHE_SIZE"),
                   block_bytes=parse_size(env("EVENFLOW_BLOCK_SIZE", "16M"), "EVENFLOW_BLOCK_SIZE"),
                   timeout_s=_seconds("EVENFLOW_STORE_TIMEOUT", 20.0),
                   deadline_s=_seconds("EVENFLOW_STORE_DEADLINE", 120.0))
