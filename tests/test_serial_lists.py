"""Every entry of tests/conftest.py's SERIAL and NOT_SERIAL names a test file, folder or test that exists."""
from __future__ import annotations

import re

from tests.conftest import HERE, NOT_SERIAL, SERIAL


def test_every_serial_entry_names_a_file_or_folder():
    assert [s for s in SERIAL if not (HERE / s).exists()] == []


def test_every_not_serial_entry_names_a_file_or_one_of_its_tests():
    missing = []
    for entry in NOT_SERIAL:
        path, _, name = entry.partition("::")
        if not (HERE / path).is_file():
            missing.append(entry)
        elif name and not re.search(rf"^def {name}\(", (HERE / path).read_text(), re.M):
            missing.append(entry)
    assert missing == []


def test_the_serial_pass_imports_only_the_files_that_hold_serial_tests():
    from types import SimpleNamespace

    from tests.conftest import pytest_ignore_collect

    def ignored(rel: str, markexpr: str = "serial"):
        config = SimpleNamespace(getoption=lambda name, default=None: markexpr)
        return pytest_ignore_collect(HERE / rel, config)

    assert ignored("faults/test_startup.py") is None                # in a SERIAL folder
    assert ignored("tf/test_rebalance.py") is None                  # some of its tests serial, some not
    assert ignored("faults/test_bad_values.py") is True             # a SERIAL folder's file moved whole
    assert ignored("plan/test_plan.py") is True                     # never serial
    assert ignored("plan/test_plan.py", "not serial") is None       # the parallel pass collects every file
    assert ignored("plan/conftest.py") is None                      # not a test file
