"""A one-line progress bar on stderr, with samples/s; no dependencies.

On a terminal the line is redrawn in place (at most ~10 times a second, so the
bar never slows a fast loop); when stderr is a file or a pipe only the final
line of each bar is written, so logs stay readable.
"""
from __future__ import annotations

import sys
import time

__all__ = ["ProgressBar"]


class ProgressBar:
    """Progress through ``total`` steps.

    Args:
        total: number of steps, >= 0.
        label: text in front of the bar, e.g. ``"epoch 3/10"``.
        stream: where to write (default ``sys.stderr``).
        width: bar width in characters.
    """

    def __init__(self, total: int, label: str = "", stream=None, width: int = 24):
        self.total, self.label, self.width = max(int(total), 0), label, width
        self.stream = sys.stderr if stream is None else stream
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.samples = 0
        self._pending: list = []
        self.info = ""
        self._start = time.perf_counter()
        self._last_draw = 0.0

    def update(self, steps: int = 1, samples=0, info: str = "") -> None:
        """Advance by ``steps`` steps that processed ``samples`` samples; ``info`` is shown after the rate.

        ``samples`` may be a callable returning the count: it is called only when the
        bar is drawn (so a training loop need not wait for a device value every step).
        """
        self.done = min(self.done + steps, self.total)
        self._pending.append(samples)
        if info:
            self.info = info
        now = time.perf_counter()
        if self.live and (now - self._last_draw > 0.1 or self.done == self.total):
            self._last_draw = now
            self.stream.write("\r" + self.line())
            self.stream.flush()

    def _settle(self) -> None:
        self.samples += sum(int(s() if callable(s) else s) for s in self._pending)
        self._pending.clear()

    @property
    def rate(self) -> float:
        """Samples per second since the bar started."""
        self._settle()
        elapsed = time.perf_counter() - self._start
        return self.samples / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        """The bar as text (without line ending)."""
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        text = f"{self.label} [{bar}] {self.done}/{self.total} {self.rate:,.0f} samples/s"
        return f"{text}  {self.info}" if self.info else text

    def close(self, info: str = "") -> None:
        """Finish the bar's line (the only line written when stderr is not a terminal)."""
        if info:
            self.info = info
        self.stream.write(("\r" if self.live else "") + self.line() + "\n")
        self.stream.flush()
