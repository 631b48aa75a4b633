"""The collective timeout's watchdog: one thread, fires only past the timeout, and only inside a waiting call."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("tensorflow")
from evenflow.tf import collective_watch as cw  # noqa: E402


def test_it_aborts_a_call_that_waits_past_the_timeout_and_nothing_else(monkeypatch):
    fired = []
    monkeypatch.setattr(cw.CollectiveWatch, "abort", lambda self: (fired.append(time.monotonic()),
                                                                  setattr(self, "fired", True)))
    watch = cw.CollectiveWatch(0.4)
    assert watch.interval == pytest.approx(0.02)
    before = threading.active_count()
    for _ in range(50):  # short calls, nested ones too: never fire, and one thread in all
        with watch.waiting(), watch.waiting():
            time.sleep(0.005)
    assert threading.active_count() == before + 1
    time.sleep(0.6)  # idle between calls: not a wait
    assert not fired
    began = time.monotonic()
    with watch.waiting():
        while not fired and time.monotonic() - began < 30:
            time.sleep(0.01)
    assert fired and fired[0] - began >= 0.4, fired  # never before the timeout
    assert watch.fired


def test_without_a_timeout_it_starts_nothing():
    watch = cw.CollectiveWatch(None)
    before = threading.active_count()
    with watch.waiting():
        pass
    assert threading.active_count() == before and not watch.fired
