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
