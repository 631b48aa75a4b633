"""``evenflow inspect RUN_DIR`` plans what a run trained on; ``--dataset builtin:digits``; one batch flag in
every command; an unknown flag gets the command's own usage and the flag meant."""
from __future__ import annotations

import json

import pytest

import evenflow as ef
from evenflow.cli import _build_parser, main
from evenflow.data.load import load_dataset
from evenflow.run.config import load_config

RUN = {"replicas": 4, "config": {"dataset": "builtin:digits", "global_batch_size": 64, "seed": 3, "stratify": True,
                                 "balance": "count", "bucket": False, "test_fraction": 0.2, "split_seed": 0,
                                 "replicas": 4, "eval_dataset": "", "feature_key": None, "label_key": None}}


def _run_dir(tmp_path):
    run = tmp_path / "demo"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(RUN))
    return run


def _inspect_json(argv, capsys) -> dict:
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _train_plan(replicas: int) -> ef.Plan:
    """The plan `evenflow train` builds for RUN's config: its training split, its options."""
    index = load_dataset(load_config(overrides={"dataset": "builtin:digits"}).data).train.index()
    return ef.Plan(index, ef.Topology(replicas), global_batch_size=64, seed=3, stratify=True)


def test_a_run_directory_gives_the_plan_the_run_trained_on(tmp_path, capsys):
    pytest.importorskip("sklearn")
    run = _run_dir(tmp_path)
    got = _inspect_json([str(run)], capsys)
    assert got == json.loads(json.dumps(_train_plan(4).epoch(0).summary()))
    assert got["real_samples"] == 1438  # the training split, not all 1797 digits
    on_two = _inspect_json([str(run), "--replicas", "2"], capsys)  # a flag replaces the run's value
    assert on_two == json.loads(json.dumps(_train_plan(2).epoch(0).summary()))
    assert main(["inspect", str(run)]) == 0
    assert "Plan(Index(num_samples=1438, num_classes=10), Topology(replicas=4" in capsys.readouterr().out


def test_a_folder_without_a_summary_is_one_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evenflow inspect: error: ") and "summary.json not found" in err and "\n" not in err


def test_builtin_digits_and_the_flags_required_without_a_run(capsys):
    pytest.importorskip("sklearn")
    got = _inspect_json(["--dataset", "builtin:digits", "--replicas", "4", "--global-batch-size", "64"], capsys)
    assert got["real_samples"] == 1797 and [r["real"] for r in got["per_replica"]] == [450, 449, 449, 449]
    assert main(["inspect", "--samples", "100", "--batch-size", "10"]) == 2
    err = capsys.readouterr().err
    assert "--replicas is required (or a run directory: evenflow inspect RUN_DIR)" in err


@pytest.mark.parametrize("command", ["train", "demo", "inspect"])
def test_one_batch_flag_with_one_meaning_in_every_command(command):
    parser = _build_parser()
    dest = "batch_size" if command == "inspect" else "global_batch_size"
    for flag in ("--global-batch-size", "--batch-size"):
        args = parser.parse_args([command, flag, "32"])
        assert getattr(args, dest) == 32


@pytest.mark.parametrize("argv, meant", [(["train", "--batch-sze", "32"], "--batch-size"),
                                         (["inspect", "--replicas", "2", "--global-bach-size=8"],
                                          "--global-batch-size"),
                                         (["demo", "--epoch", "2", "--sed", "1"], "--seed")])
def test_an_unknown_flag_gets_the_commands_usage_and_the_flag_meant(argv, meant, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: evenflow {argv[0]} ")
    assert f"evenflow {argv[0]}: error: unrecognized arguments:" in err and f"(did you mean {meant}?)" in err


def test_a_run_without_its_summary_is_planned_from_its_newest_checkpoint(tmp_path, capsys):
    """A run that has not finished (killed, or still training) has no summary.json yet: its checkpoint says."""
    pytest.importorskip("sklearn")
    pytest.importorskip("torch")
    run = tmp_path / "run"
    assert main(["train", "--framework", "torch", "--dataset", "builtin:digits", "--epochs", "1",
                 "--global-batch-size", "64", "--seed", "3", "--stratify", "--output-dir", str(run)]) == 0
    capsys.readouterr()
    finished = _inspect_json([str(run)], capsys)
    (run / "summary.json").unlink()
    assert _inspect_json([str(run)], capsys) == finished == json.loads(json.dumps(_train_plan(1).epoch(0).summary()))
