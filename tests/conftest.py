"""Suite-wide: which tests run alone.

``make test`` runs the suite in two passes: first every test not marked ``serial`` on two
pytest-xdist workers (``-n 2 --dist loadfile``: a file's tests share one worker, so its module
fixtures run once), then the ``serial`` tests one at a time. Serial are the tests whose assertions
rest on measured speeds or short timings (a re-plan from measured speeds, an emulated slowdown,
input wait, a node that must join before the other's epoch ends, a signal that must end a waiting
worker within seconds) and those that would see the processes of other tests (a busy core found by
its command line): run beside other tests, their timings or their view of the machine would be
disturbed by work that is not theirs. The tests of cooperating processes with generous deadlines and
no timing in their assertions run in the parallel pass, where their waits overlap other work: the
parameter-server and sharded-parameter tests, the Slurm-launched runs, two ranks of your own DDP
loop, the checkpoint and run-directory faults (one process at a time, killed at fixed points), the
refusals of bad values, damaged records and other data (in this process, before or without any
peer), and the crash-and-resume runs of tf/test_fault_tolerance.py (one process at a time, killed by
its driver). So do, by the same rule, the tests of a lost, killed or stalled peer, whose wall is a
collective timeout or a restart rather than CPU and whose deadlines allow several times their time
on a busy machine: the Ray tests (one file, ray/test_ray_train.py, so that one worker starts the
cluster once; a worker killed, Ray restarts the group: exit codes and audits asserted); the DDP
ranks of torch/test_ddp.py (a killed rank is noticed by the broken connection in about a second, 15
s allowed); all of tf/test_multiworker.py (a killed worker noticed within 35 s, a stalled one ending
at its 20 s collective timeout, the 2-worker run checked against one worker); all of
tf/test_keras_fit_multiworker.py (the 2-worker ``evenflow.tf.fit`` run checked against one process,
a stalled worker ending at its 8 s collective timeout, a killed one noticed within 60 s); the
workers or ranks refused for different data or seeds before their first step
(faults/test_data_agreement.py, the pre-flight test of tf/test_rebalance.py: 30 s collective
timeouts, only exit codes and lines asserted); the 3 gloo ranks of torch/test_cli_resume.py, one
killed at a fixed update (noticed by the broken connection, nothing timed); the lost node of
torch/test_elastic_nodes.py (killed after the first checkpoint; the survivor's agent restarts it,
nothing timed: 30 s collective timeout, exit codes, audit and summary asserted; the joining node,
which must join before the first one's epoch ends, stays serial); the launcher's line prefixes,
ports and bad input (tf/test_launcher.py; its exit codes, SIGKILL grace and pinned cores stay
serial); the private and shared networks of ``evenflow launch`` (faults/test_launch_network.py: two
tiny workers, 20 s to start); the tests of tf/test_rebalance.py that time nothing (a refusal, the
monitor's arithmetic, auto keeping the plan of logical devices); and the rows of
cli/test_flag_table.py whose effect is not timed (their runs check outputs, exit codes and lines: 60
s collective timeouts, two runs at a time by design), while its re-plan and slowdown rows stay
serial on two runs of their own. A ``file::test`` entry moves that test alone; the rest of its file
stays serial.
"""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Generous deadlines, no kills to notice and no timings in the assertions: in the parallel pass.
NOT_SERIAL = ("faults/test_checkpoint_faults.py", "faults/test_checkpoint_trust.py", "faults/test_records_trust.py",
              "faults/test_input_refusals.py", "faults/test_loader_worker_death.py",
              "faults/test_readback_digests.py", "faults/test_bad_values.py", "faults/test_every_flag.py",
              "faults/test_damaged_records.py", "faults/test_resume_identity.py", "faults/test_run_directory.py",
              "faults/test_launch_network.py",
              "torch/test_own_loop_ddp.py", "examples/test_torch_ddp_own_dataset.py",
              "faults/test_data_agreement.py", "torch/test_cli_resume.py",
              "tf/test_launcher.py::test_every_line_is_prefixed_and_all_workers_succeed",
              "tf/test_launcher.py::test_bad_input_is_one_line_and_exit_2",
              "tf/test_launcher.py::test_options_and_ports",
              "tf/test_rebalance.py::test_two_workers_with_different_seeds_fail_the_preflight_check",
              "tf/test_rebalance.py::test_fewer_samples_than_replicas_fail_before_anything_is_written",
              "tf/test_rebalance.py::test_auto_keeps_the_plan_of_logical_devices_slowed_without_a_device_time_of_their_own",
              "tf/test_rebalance.py::test_a_bad_simulate_slow_value_is_one_line_exit_2",
              "tf/test_rebalance.py::test_monitor_writes_one_line_per_update_and_decides_from_the_gathered_window",
              "tf/test_rebalance.py::test_the_monitor_measures_what_opening_the_pipelines_and_a_replan_cost",
              "cli/test_flag_table.py::test_the_table_has_a_row_for_every_option",
              "cli/test_flag_table.py::test_each_option_is_honoured_or_refused",
              "torch/test_elastic_nodes.py::"
              "test_a_lost_node_leaves_the_survivor_to_finish_at_world_size_one_exactly_once")
SERIAL = ("faults/", "tf/test_rebalance.py", "tf/test_launcher.py", "torch/test_cli_resume.py",
          "cli/test_flag_table.py", "torch/test_elastic_nodes.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "serial: runs alone, after the parallel pass (see tests/conftest.py)")
    # pytest-xdist hands out --dist loadfile's files by their number of tests unless told otherwise; FIRST's order
    # (below) is the one that balances the two workers, so the files go in collection order.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The longest files of the parallel pass first, longest first (seconds of test time in measured runs):
# `--dist loadfile` hands whole files to the two workers in collection order, so a long file handed out
# last would leave one worker idle; the files not named here take a few seconds each.
FIRST = ("ray/test_ray_train.py", "test_doc_shell_blocks.py", "test_doc_blocks.py", "faults/test_checkpoint_faults.py",
         "tf/test_kernel_paths.py", "cli/test_flag_table.py", "cli/test_text_cli.py", "tf/test_ps.py",
         "faults/test_checkpoint_trust.py", "tf/test_fault_tolerance.py", "tf/test_keras_exact_steps.py",
         "faults/test_data_agreement.py", "tf/test_multiworker.py", "torch/test_ddp.py", "benchmarks/test_benchmarks_run.py",
         "tf/test_keras_fit.py", "cli/test_records_train.py", "tf/test_rebalance.py",
         "tf/test_keras_fit_multiworker.py", "torch/test_cli_resume.py", "torch/test_elastic_nodes.py",
         "cli/test_demo_train.py", "torch/test_sharded.py", "tf/test_text.py", "cli/test_eval_dataset.py",
         "tf/test_exactly_once.py", "examples/test_keras_fit_mirrored.py", "run/test_monitor_options.py",
         "torch/test_own_loop_ddp.py", "torch/test_torch_records_cli.py", "examples/test_variable_length_tokens.py",
         "cli/test_token_records_cli.py", "tf/test_world_size.py")


def _rank(item) -> int:
    rel = Path(str(item.fspath)).resolve().as_posix()
    return next((i for i, name in enumerate(FIRST) if rel.endswith("/tests/" + name)), len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: within a file, and among the other files, the order stays
    for item in items:
        path = Path(str(item.fspath)).resolve()
        try:
            rel = path.relative_to(HERE).as_posix()
        except ValueError:
            continue
        if rel in NOT_SERIAL or f"{rel}::{getattr(item, 'originalname', item.name)}" in NOT_SERIAL:
            continue
        if any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in SERIAL):
            item.add_marker(pytest.mark.serial)


def pytest_ignore_collect(collection_path, config):
    """Under ``-m serial`` (the suite's serial pass), skip importing the test files that hold no serial test:
    collecting the whole suite to select its serial tests took 25-40 s of that pass."""
    if config.getoption("markexpr", "") != "serial" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    try:
        rel = collection_path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return None
    if rel in NOT_SERIAL or not any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in SERIAL):
        return True
    return None
