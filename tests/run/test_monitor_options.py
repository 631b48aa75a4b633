"""MonitorOptions -> RebalanceOptions: what the command line's rebalancing flags become."""
from __future__ import annotations

from evenflow.run.options import MonitorOptions


def test_a_threshold_above_the_urgent_gain_is_accepted_and_raises_it():
    # --rebalance-threshold 3: re-plan only for 3x faster steps; the at-once gain (1.5 by default,
    # not a command-line flag) follows it instead of refusing the run.
    options = MonitorOptions(rebalance="on", rebalance_threshold=3.0).rebalance_options()
    assert options.enabled and options.threshold == 3.0 and options.urgent == 3.0
    default = MonitorOptions(rebalance="on").rebalance_options()
    assert default.threshold == 1.1 and default.urgent == 1.5
