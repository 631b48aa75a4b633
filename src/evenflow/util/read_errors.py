"""Notes on errors raised by a user's own data code, naming the samples evenflow asked it for."""
from __future__ import annotations


def note_samples(error: BaseException, call: str, ids) -> None:
    """Add ``(raised by CALL for sample ids ..., read by evenflow)`` to ``error`` (once per error).

    The error keeps its type, message and traceback: it is the user's code that failed, and the
    note tells which samples it was reading when it did.
    """
    shown = ", ".join(str(int(i)) for i in ids[:8]) + (f", ... ({len(ids)} ids)" if len(ids) > 8 else "")
    if not any(n.startswith("(raised by ") for n in getattr(error, "__notes__", ())):
        add_note(error, f"(raised by {call} for sample ids {shown}, read by evenflow)")


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` where Python has it (3.11 and later); on 3.10 the same ``__notes__`` list.

    Python 3.10 prints no ``__notes__`` under a traceback, so there an error whose one argument is
    its message also carries the note on a line of its own under that message (``str(error)``).
    """
    if hasattr(error, "add_note"):
        error.add_note(note)
        return
    notes = getattr(error, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        error.__notes__ = notes
    notes.append(note)
    if len(error.args) == 1 and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}",)
