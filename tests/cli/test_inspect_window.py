"""`evenflow inspect --steps A:B`: a window of an epoch, equal to those steps of the whole epoch's plan,
planned in proportion to the window (so epochs too large to plan whole can be looked at)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main
from evenflow.commands.inspect import load_column
from evenflow.plan.metrics import summarize
from evenflow.report.tokens import compare_modes, token_summary

N, R, G = 5_000, 4, 96


@pytest.fixture(scope="module")
def columns(tmp_path_factory):
    root = tmp_path_factory.mktemp("window")
    rng = np.random.default_rng(0)
    labels, costs = rng.integers(0, 5, N), rng.lognormal(3.0, 1.0, N).round() + 1
    np.save(root / "labels.npy", labels)
    np.save(root / "costs.npy", costs)
    return root, labels, costs


def _inspect(capsys, *argv) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("options", [
    {"balance": "count"},
    {"balance": "cost"},
    {"balance": "cost", "bucket": True, "bucket_window": 4},
    {"balance": "count", "stratify": True},
    {"balance": "cost", "weights": (1, 1, 0.5, 1)},
])
@pytest.mark.parametrize("window", [(0, 1), (7, 19), (40, 53)])
def test_a_window_is_those_steps_of_the_whole_epoch(columns, capsys, options, window):
    root, labels, costs = columns
    first, last = window
    argv = ["--labels", str(root / "labels.npy"), "--costs", str(root / "costs.npy"), "--replicas", str(R),
            "--batch-size", str(G), "--balance", options["balance"], "--epoch", "2", "--seed", "3",
            "--steps", f"{first}:{last}", "--json"]
    if options.get("bucket"):
        argv += ["--bucket", "--bucket-window", str(options["bucket_window"])]
    if options.get("stratify"):
        argv.append("--stratify")
    if options.get("weights"):
        argv += ["--weights", ",".join(map(str, options["weights"]))]
    code, out, err = _inspect(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    index = ef.Index(N, labels=labels, costs=costs)
    topology = ef.Topology(R, weights=options.get("weights"))
    plan = ef.Plan(index, topology, global_batch_size=G, seed=3, **{k: v for k, v in options.items() if k != "weights"})
    whole = plan.epoch(2)
    expected = summarize(dataclasses.replace(whole, ids=whole.ids[first:last], start_step=first))
    assert got.pop("modes") is not None
    assert got == json.loads(json.dumps(expected))
    assert got["start_step"] == first and got["num_steps"] == last - first and got["total_steps"] == whole.num_steps


def test_the_modes_table_compares_the_same_steps(columns):
    root, labels, costs = columns
    index, topology = ef.Index(N, labels=labels, costs=costs), ef.Topology(R)
    rows = compare_modes(index, topology, G, seed=1, epoch=0, bucket_window=4, steps=(5, 9))
    assert [r["mode"] for r in rows] == ["count", "count+bucket", "cost", "cost+bucket"]  # no pack row
    for row, (balance, bucket) in zip(rows, [("count", False), ("count", True), ("cost", False), ("cost", True)]):
        plan = ef.Plan(index, topology, global_batch_size=G, seed=1, balance=balance, bucket=bucket,
                       **({"bucket_window": 4} if bucket else {}))
        assert row == {"mode": row["mode"], **token_summary(plan.epoch(0).ids[5:9], costs)}


def test_the_table_names_the_window(columns, capsys):
    root, _, _ = columns
    code, out, err = _inspect(capsys, "--costs", str(root / "costs.npy"), "--replicas", str(R), "--batch-size",
                              str(G), "--balance", "cost", "--steps", "50:")
    assert code == 0, err
    steps = -(-N // G)
    assert f"steps {steps - 50} (steps 50-{steps - 1} of the epoch's {steps})" in out
    assert "window" in out.splitlines()[out.splitlines().index(next(x for x in out.splitlines()
                                                                       if x.startswith("label deviation")))]
    assert "modes compared on the same steps; no pack row" in out


@pytest.mark.parametrize("steps, fragment", [
    ("5:2", "at least one of the epoch's 53 steps"),
    ("0:54", "at least one of the epoch's 53 steps"),
    ("-1:3", "at least one of the epoch's 53 steps"),
    ("3", "--steps must be A:B with whole numbers"),
    ("a:b", "--steps must be A:B with whole numbers"),
    ("1.5:3", "--steps must be A:B with whole numbers"),
])
def test_bad_windows_are_refused(capsys, steps, fragment):
    code, out, err = _inspect(capsys, "--samples", str(N), "--replicas", str(R), "--batch-size", str(G),
                              f"--steps={steps}")
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1, err


def test_steps_with_pack_are_refused(capsys):
    code, out, err = _inspect(capsys, "--dataset", "builtin:stdlib-docs", "--replicas", "2", "--batch-size", "20",
                              "--pack", "512", "--steps", "0:2")
    assert code == 2 and out == "" and "--steps and --pack" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--bucket-window", "8"], "--bucket-window 8 sets the windows of --bucket and of the modes table's bucket rows"),
    (["--pack-overflow", "split"], "--pack-overflow split applies to a packed plan, and there is no --pack"),
])
def test_options_that_would_change_nothing_are_refused(capsys, argv, fragment):
    code, out, err = _inspect(capsys, "--samples", str(N), "--replicas", str(R), "--batch-size", str(G), *argv)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1, err


def test_the_bucket_window_shapes_the_modes_tables_bucket_rows_without_bucket(columns, capsys):
    root = columns[0]
    rows = {}
    for window in ("2", "64"):
        code, out, err = _inspect(capsys, "--costs", str(root / "costs.npy"), "--replicas", str(R), "--batch-size",
                                  str(G), "--balance", "cost", "--bucket-window", window, "--json")
        assert code == 0, err
        rows[window] = {r["mode"]: r for r in json.loads(out)["modes"]}
    assert rows["2"]["cost"] == rows["64"]["cost"]  # no bucket: the window plays no part
    assert rows["2"]["cost+bucket"]["token_efficiency"] < rows["64"]["cost+bucket"]["token_efficiency"]


def test_an_epoch_too_large_to_plan_whole_is_inspected_a_window_at_a_time(capsys):
    n = 10**11  # about 2.5 TiB of plan: refused whole, named the way out
    code, out, err = _inspect(capsys, "--samples", str(n), "--replicas", "8", "--batch-size", "256")
    assert code == 2 and out == "" and "pass --steps A:B to inspect a window of steps" in err
    code, out, err = _inspect(capsys, "--samples", str(n), "--replicas", "8", "--batch-size", "256",
                              "--steps", "1000:1002", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["num_steps"] == 2 and got["total_steps"] == n // 256 and got["real_samples"] == 512
    assert got["token_efficiency"] == 1.0 and got["imbalance_max"] == 1.0


def test_a_stratified_window_too_large_is_refused_saying_why(columns, capsys, monkeypatch):
    root, _, _ = columns
    monkeypatch.setattr("evenflow.plan.memory._physical_bytes", lambda: 100_000)  # an epoch of N: 140,000 bytes
    argv = ["--labels", str(root / "labels.npy"), "--replicas", str(R), "--batch-size", str(G), "--steps", "0:1"]
    code, out, err = _inspect(capsys, *argv)
    assert code == 0, err  # 96 samples fit
    code, out, err = _inspect(capsys, *argv, "--stratify")  # a stratified order is built for the whole epoch
    assert code == 2 and out == "" and "--stratify orders the whole epoch by label for any window" in err
    code, out, err = _inspect(capsys, *argv[:-1], "0:40")
    assert code == 2 and "planning a window of 3,840 samples" in err and "pass a shorter --steps window" in err


def test_a_costs_npy_is_memory_mapped_and_missing_costs_cost_nothing(columns):
    root, _, costs = columns
    got = load_column(str(root / "costs.npy"), "costs", integer=False)
    assert isinstance(got, np.memmap) and np.array_equal(got, costs)
    ones = ef.Index(10**12).cost_or_ones()
    assert ones.shape == (10**12,) and ones.strides == (0,) and not ones.flags.writeable and ones[123] == 1.0


@pytest.mark.parametrize("argv, said", [
    (["--samples", "0", "--batch-size", "4"], "--samples must be at least 1, got 0"),
    (["--samples", "10", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--samples", "10", "--batch-size", "4", "--stratify"], "--stratify needs labels: pass --labels FILE"),
    (["--samples", "10", "--batch-size", "4", "--bucket"], "--bucket needs costs: pass --costs FILE")])
def test_plan_errors_name_the_flags_not_the_python_arguments(capsys, argv, said):
    assert main(["inspect", "--replicas", "2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"evenflow inspect: error: {said}") and "\n" not in err
