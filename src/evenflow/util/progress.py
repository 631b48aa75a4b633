"""The one progress display of evenflow (training epochs, conversions, indexing), drawn by ``rich``.

On a terminal the bar is redrawn in place by rich (a few times a second, from its own
thread, so a fast loop is never slowed by drawing). When the stream is a file or a pipe
nothing is drawn while the work runs and one final line per bar is written, so logs and
captured output stay readable::

    epoch  2 ( 3/20) [########################] 22/22 2,905 samples/s  loss 0.2213  accuracy 0.9350
"""
from __future__ import annotations

import sys
import time


class ProgressBar:
    """Progress through ``total`` steps (or records), with a rate.

    Args:
        total: units of work, >= 0.
        label: text in front of the bar, e.g. ``"epoch 2 (3/10)"``.
        stream: where to write (default ``sys.stderr``).
        unit: what the rate counts, e.g. ``"samples"`` or ``"records"``.
        width: bar width in characters.
    """

    def __init__(self, total: int, label: str = "", stream=None, unit: str = "samples", width: int = 24):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.total, self.label, self.unit, self.width = max(int(total), 0), label, unit, width
        self.stream = sys.stderr if stream is None else stream
        console = Console(file=self.stream, stderr=self.stream is sys.stderr)
        self.live = bool(console.is_terminal)
        self.done = 0
        self.samples = 0
        self.info = ""
        self._pending: list = []
        self._start = time.perf_counter()
        self._progress = None
        self._stopped = False
        if self.live:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=width),
                                      MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                      TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                      console=console, transient=False, refresh_per_second=8)
            self._task = self._progress.add_task(label, total=self.total, rate="", info="")
            self._progress.start()

    def update(self, steps: int = 1, samples=0, info: str = "") -> None:
        """Advance by ``steps`` that processed ``samples`` units; ``info`` is shown after the rate.

        ``samples`` may be a callable returning the count: it is called only when the rate
        is needed (so a training loop need not wait for a device value every step).
        """
        self.done = min(self.done + int(steps), self.total)
        self._pending.append(samples)
        if info:
            self.info = info
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, rate=f"{self.rate:,.0f} {self.unit}/s",
                                  info=self.info)

    def _settle(self) -> None:
        self.samples += sum(int(s() if callable(s) else s) for s in self._pending)
        self._pending.clear()

    @property
    def rate(self) -> float:
        """Units per second since the bar started."""
        self._settle()
        elapsed = time.perf_counter() - self._start
        return self.samples / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        """The bar as one line of text (what a log gets)."""
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        text = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{self.rate:,.0f} {self.unit}/s")
        return f"{text}  {self.info}" if self.info else text

    def close(self, info: str = "") -> None:
        """Finish the bar: its final state stays on the terminal, or one line goes to the log."""
        if info:
            self.info = info
        if self._stopped:
            return
        self._stopped = True
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, rate=f"{self.rate:,.0f} {self.unit}/s",
                                  info=self.info)
            self._progress.stop()
            self._progress = None
            return
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def stop(self) -> None:
        """Stop redrawing a bar that will not finish (the work failed or was interrupted): the terminal
        keeps its last state and gets its cursor back; a log gets no line. Closing or stopping again does nothing."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._stopped = True

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
