"""``Simulation``, ``SlowReplica`` and ``RebalanceOptions`` refuse, when built, what would fail or mislead later."""
from __future__ import annotations

import pytest

from evenflow.plan import RebalanceOptions
from evenflow.run.simulate import Simulation, SlowReplica, parse_slow


@pytest.mark.parametrize("slow,error,fragment", [
    ("1:2", TypeError, r"slow must be a tuple of SlowReplica .*parse_slow\('1:2'\) .*got '1:2'"),
    (SlowReplica(1, 2.0), TypeError, "slow must be a tuple of SlowReplica"),
    (((1, 2.0),), TypeError, "slow must be a tuple of SlowReplica"),
    ((SlowReplica(1, 2.0), SlowReplica(1, 3.0, 50)), ValueError, r"names replica\(s\) \[1\] more than once"),
])
def test_a_simulation_names_slow_replicas_it_cannot_use(slow, error, fragment):
    with pytest.raises(error, match=fragment):
        Simulation(slow)


def test_a_simulation_takes_a_list_and_the_command_line_form_and_refuses_booleans():
    assert Simulation([SlowReplica(0, 2.0)]).slow == (SlowReplica(0, 2.0),)
    assert Simulation(parse_slow("1:2@10")).slow == (SlowReplica(1, 2.0, 10),)
    with pytest.raises(ValueError, match=r"simulate_sample_ms must be a number, got bool \(True\)"):
        Simulation(sample_ms=True)
    with pytest.raises(ValueError, match=r"the factor must be a number, got bool \(True\)"):
        SlowReplica(1, True)


def test_rebalance_options_name_the_argument_given_and_refuse_booleans():
    with pytest.raises(ValueError, match=r"urgent must be at least 2, got 1.5; urgent is at least threshold: with "
                                         r"threshold=2 pass urgent=2 or more"):
        RebalanceOptions(threshold=2.0)
    assert RebalanceOptions(threshold=2.0, urgent=3.0).urgent == 3.0
    assert RebalanceOptions(urgent=float("inf"), jump=float("inf")).jump == float("inf")  # never urgent, never jump
    for name in ("threshold", "payback", "smoothing", "jump", "resolution"):
        with pytest.raises(ValueError, match=rf"{name} must be a number, got bool \(True\)"):
            RebalanceOptions(**{name: True})
