"""The smallest ModelState, for tests of the run layer's checkpoints without a framework: one file."""
from __future__ import annotations


class TinyState:
    """Writes ``state.txt`` holding ``x``; reads nothing."""

    learning_rate = 0.1
    needs_every_process = False

    def describe(self):
        return {}

    def is_finite(self):
        return True

    def write(self, directory):
        (directory / "state.txt").write_text("x")

    def read(self, directory):
        pass
