"""Notes on errors raised by a user's own data code, naming the samples evenflow asked it for."""
from __future__ import annotations


def note_samples(error: BaseException, call: str, ids) -> None:
    """Add ``(raised by CALL for sample ids ..., read by evenflow)`` to ``error`` (once per error).

    The error keeps its type, message and traceback: it is the user's code that failed, and the
    note tells which samples it was reading when it did.
    """
    shown = ", ".join(str(int(i)) for i in ids[:8]) + (f", ... ({len(ids)} ids)" if len(ids) > 8 else "")
    if not any(n.startswith("(raised by ") for n in getattr(error, "__notes__", ())):
        error.add_note(f"(raised by {call} for sample ids {shown}, read by evenflow)")
