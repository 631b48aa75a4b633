"""A one-line progress bar on stderr for long conversions, with no dependency.

It redraws at most ten times a second and only when the stream is a terminal, so logs
and tests see nothing but the final summary the caller prints.
"""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Counts work done out of ``total`` and draws ``label [####....]  45%  1234/2734  3.2k/s``.

    Args:
        total: units of work expected (records).
        label: text before the bar.
        stream: where to draw, default ``sys.stderr``.
        enabled: force on or off; default on when ``stream`` is a terminal.
    """

    def __init__(self, total: int, label: str = "", *, stream=None, enabled: bool | None = None, width: int = 30):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.width = width
        self.done = 0
        self._start = time.perf_counter()
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.width)
        rate = self.done / max(now - self._start, 1e-9)
        rate_s = f"{rate / 1e3:.1f}k/s" if rate >= 1e3 else f"{rate:.0f}/s"
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {frac:4.0%} "
                          f"{self.done}/{self.total} {rate_s}  ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
