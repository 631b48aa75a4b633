"""tests/conftest.py's FIRST list: the files the parallel pass hands out first, in that order."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import FIRST, NOT_SERIAL, SERIAL

HERE = Path(__file__).resolve().parent


def test_each_entry_is_a_test_file_of_the_parallel_pass_named_once():
    assert len(set(FIRST)) == len(FIRST), [f for f in FIRST if FIRST.count(f) > 1]
    for name in FIRST:
        assert (HERE / name).is_file(), f"FIRST names {name}, which is not a file of tests/"
        serial = any(name == s or (s.endswith("/") and name.startswith(s)) for s in SERIAL)
        assert not serial or any(e == name or e.startswith(name + "::") for e in NOT_SERIAL), \
            f"FIRST names {name}, whose tests all run in the serial pass"


def test_xdist_keeps_the_collection_order(pytestconfig):
    """pytest-xdist would hand out loadfile's files by their number of tests; FIRST's order needs collection order."""
    assert getattr(pytestconfig.option, "loadscopereorder", False) is False
