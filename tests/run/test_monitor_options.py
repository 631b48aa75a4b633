"""MonitorOptions -> RebalanceOptions: what the command line's rebalancing flags become."""
from __future__ import annotations

import pytest

from evenflow.cli import main
from evenflow.run.options import MonitorOptions


def test_a_threshold_above_the_urgent_gain_is_accepted_and_raises_it():
    # --rebalance-threshold 3: re-plan only for 3x faster steps; the at-once gain (1.5 by default,
    # not a command-line flag) follows it instead of refusing the run.
    options = MonitorOptions(rebalance="on", rebalance_threshold=3.0).rebalance_options()
    assert options.enabled and options.threshold == 3.0 and options.urgent == 3.0
    default = MonitorOptions(rebalance="on").rebalance_options()
    assert default.threshold == 1.1 and default.urgent == 1.5


def test_auto_rebalances_logical_devices_only_when_they_emulate_devices_of_their_own():
    # On logical devices sharing one CPU's cores, --simulate-slow alone scales the time the shared
    # cores give a replica: a re-plan from it chases the scheduler (measured on digits, 4 replicas,
    # one 3x slow: even the true weights run 1.01-1.07x as fast as none), so auto keeps the plan.
    # --simulate-sample-ms gives each replica a device time of its own: auto re-plans.
    slow_only = MonitorOptions(simulate_slow="2:3")
    assert not slow_only.rebalance_options(shared_cpu=True).enabled
    assert slow_only.rebalance_options(shared_cpu=False).enabled  # separate processes or devices
    assert MonitorOptions(simulate_slow="2:3", rebalance="on").rebalance_options(shared_cpu=True).enabled
    devices = MonitorOptions(simulate_slow="2:3", simulate_sample_ms=2.0)
    assert devices.rebalance_options(shared_cpu=True).enabled
    assert not devices.rebalance_options(shared_cpu=True, deterministic=True).enabled
    assert not MonitorOptions().rebalance_options(shared_cpu=True).enabled
    assert MonitorOptions().rebalance_options(shared_cpu=False).enabled


@pytest.mark.parametrize("name, value", [("rebalance_threshold", 1.2), ("rebalance_payback", 0.0)])
def test_what_decides_a_replan_is_refused_when_rebalancing_is_off(capsys, name, value):
    with pytest.raises(ValueError, match=rf"^{name} {value:g} decides when to re-plan, and rebalance is off; "
                                         r"leave it out, or set rebalance to on or auto$"):
        MonitorOptions(rebalance="off", **{name: value})
    MonitorOptions(rebalance="auto", **{name: value})  # auto may turn it on
    MonitorOptions(rebalance="off")                    # the defaults change nothing either way
    flag = "--" + name.replace("_", "-")
    assert main(["train", "--dataset", "builtin:digits", "--rebalance", "off", flag, f"{value:g}"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"evenflow train: error: {flag}: {name} {value:g} decides when to re-plan") and out == ""


def test_auto_keeps_the_plan_of_one_replica():
    assert not MonitorOptions().rebalance_options(single=True).enabled
    assert MonitorOptions(rebalance="on").rebalance_options(single=True).enabled  # forced: nothing to re-plan
    assert MonitorOptions().rebalance_options(single=False).enabled


@pytest.mark.slow
@pytest.mark.parametrize("flags, line", [
    ([], "rebalancing off (auto): one replica, so there is no split to balance; telemetry is still written"),
    (["--rebalance", "on"], "rebalancing on: one replica, so there is no split to balance; telemetry is still written"),
])
def test_a_one_replica_run_says_there_is_nothing_to_balance(tmp_path, flags, line):
    pytest.importorskip("torch")
    import subprocess
    import sys

    run = subprocess.run(["timeout", "-k", "5", "180", sys.executable, "-m", "evenflow", "train", "--framework",
                          "torch", "--dataset", "builtin:digits", "--epochs", "1", "--output-dir", str(tmp_path / "r"),
                          *flags], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert line in run.stdout and "re-plan when" not in run.stdout, run.stdout
    assert (tmp_path / "r" / "telemetry.jsonl").is_file()
