"""evenflow.util.validate, the one family of value checks: the rule, the value and the fix in one line, plain values back."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.plan import PlanOptions, RebalanceOptions
from evenflow.util.validate import WrongType, check_bool, check_choice, check_int, check_number, set_checked


def test_a_wrong_type_is_a_type_error_and_a_value_error():
    for check, value in ((check_int, 1.5), (check_int, True), (check_number, "1"), (check_bool, 1)):
        with pytest.raises(WrongType) as got:
            check("x", value)
        assert isinstance(got.value, TypeError) and isinstance(got.value, ValueError)


def test_messages_state_the_rule_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"^keep must be at least 1, got 0; checkpoints kept$"):
        check_int("keep", 0, 1, fix="checkpoints kept")
    with pytest.raises(ValueError, match=r"^threads must be at most 64, got 65$"):
        check_int("threads", 65, 0, 64)
    with pytest.raises(ValueError, match=r"^p must be in \(0, 1\], got 0$"):
        check_number("p", 0, 0, 1, low_open=True)
    with pytest.raises(ValueError, match=r"^payback must be in \[0, 1e6\], got 2e\+06$"):
        check_number("payback", 2e6, 0, 1e6)
    with pytest.raises(ValueError, match=r"^jump must be greater than 0, got nan$"):
        check_number("jump", float("nan"), 0, low_open=True, finite=False)
    with pytest.raises(ValueError, match=r"^rate must be finite, got inf; e.g. 0.5$"):
        check_number("rate", float("inf"), 0, fix="e.g. 0.5")
    with pytest.raises(ValueError, match=r"^mode must be one of a, b, got 'c'$"):
        check_choice("mode", "c", ("b", "a"))
    with pytest.raises(WrongType, match=r"^flag must be true or false, got str \('yes'\)$"):
        check_bool("flag", "yes")


def test_numpy_values_come_back_plain():
    assert type(check_int("n", np.int64(3), 1)) is int and type(check_bool("b", np.bool_(True))) is bool
    assert type(check_number("f", np.float32(0.5), 0, 1)) is float
    assert check_number("jump", float("inf"), 0, low_open=True, finite=False) == float("inf")


def test_option_dataclasses_store_the_plain_values_they_checked():
    options = PlanOptions(global_batch_size=np.int64(8), stratify=np.bool_(False), pack_attention=np.float32(0))
    assert [type(v) for v in (options.global_batch_size, options.stratify, options.pack_attention)] == [int, bool, float]
    assert type(RebalanceOptions(patience=np.int64(3)).patience) is int


def test_set_checked_returns_and_stores_the_checked_value():
    class Box:
        value = np.int64(4)
    box = Box()
    assert set_checked(box, "value", check_int, 1) == 4 and type(box.value) is int
