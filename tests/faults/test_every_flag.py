"""Every ``evenflow train`` option, given a bad value on the command line and in a TOML file.

Each one stops with exit 2 and one line that names the option (``--flag`` for a flag, the file
for a TOML key), the rule and the value, before anything is written. Booleans are flags without
a value, so their bad values come from TOML.
"""
from __future__ import annotations

import pytest

from evenflow.cli import main
from evenflow.run.config import KEYS

# key -> (a bad command-line value, a fragment of the rule it breaks)
BAD = {
    "dataset": ("nowhere.npz", "does not exist"),
    "feature_key": ("", "feature_key must be a non-empty string"),
    "label_key": ("", "label_key must be a non-empty string"),
    "test_fraction": ("1.5", "test_fraction must be in [0, 1)"),
    "split_seed": ("-1", "split_seed must be at least 0"),
    "eval_dataset": ("nowhere.npz", "nowhere.npz does not exist"),
    "augment": ("warp", "augment must be 'none' or a comma list"),
    "pad_lengths": ("64,32", "pad_lengths"),
    "model": ("resnet", "model must be one of"),
    "dropout": ("1.5", "dropout must be in [0, 1)"),
    "optimizer": ("lamb", "optimizer must be one of"),
    "learning_rate": ("0", "learning_rate must be greater than 0"),
    "epochs": ("0", "epochs must be at least 1"),
    "global_batch_size": ("0", "global_batch_size must be at least 1"),
    "seed": ("-3", "seed must be at least 0"),
    "balance": ("tokens", "balance must be one of"),
    "framework": ("jax", "framework must be one of"),
    "replicas": ("0", "replicas must be at least 1"),
    "precision": ("fp8", "precision must be one of"),
    "threads": ("-1", "threads must be at least 0"),
    "communication": ("mpi", "communication must be one of"),
    "backend": ("mpi", "backend must be one of"),
    "cluster": ("lsf", "cluster must be one of"),
    "bytes_per_pack": ("-1", "bytes_per_pack must be at least 0"),
    "collective_timeout": ("0", "collective_timeout must be greater than 0"),
    "gradient_compression": ("int8", "gradient_compression must be one of"),
    "accumulate_steps": ("65", "accumulate_steps must be at most 64"),
    "loader_workers": ("-1", "loader_workers must be at least 0"),
    "strategy": ("horovod", "strategy must be one of"),
    "output_dir": ("", "output_dir must be a non-empty string"),
    "checkpoint_every": ("-1", "checkpoint_every must be at least 0"),
    "keep_checkpoints": ("0", "keep_checkpoints must be at least 1"),
    "restore_after": ("-1", "restore_after must be at least 0"),
    "restore_lr_factor": ("2", "restore_lr_factor must be in (0, 1]"),
    "max_restores": ("-1", "max_restores must be at least 0"),
    "rebalance": ("sometimes", "rebalance must be one of"),
    "rebalance_threshold": ("1", "rebalance_threshold must be greater than 1"),
    "rebalance_payback": ("-1", "rebalance_payback must be in [0, 1e6]"),
    "simulate_slow": ("3", "simulate_slow must be REPLICA:FACTOR"),
    "simulate_sample_ms": ("-2", "simulate_sample_ms must be in [0, 10000]"),
}
BOOLEANS = {"skip_corrupt", "stratify", "bucket", "resume", "audit", "deterministic", "skip_nonfinite", "telemetry",
            "shard_parameters"}


def test_every_option_has_a_bad_value_here():
    assert set(BAD) | BOOLEANS == set(KEYS)


def _one_line(capsys, argv, out) -> str:
    code = main([*argv, "--output-dir", str(out)] if "--output-dir" not in argv else argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("evenflow train: error: "), err
    assert not out.exists() or out.name == ""
    return err


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_flag_value_names_the_flag(tmp_path, capsys, key):
    value, rule = BAD[key]
    flag = "--" + key.replace("_", "-")
    argv = ["train", "--dataset", "builtin:digits", flag, value] if key != "dataset" else \
        ["train", flag, str(tmp_path / value)]
    if key == "output_dir":
        err = _one_line(capsys, argv, tmp_path / "unused")
    else:
        err = _one_line(capsys, argv, tmp_path / "out")
    assert rule in err, err
    if key == "eval_dataset":  # found when the data loads: named as the evaluation dataset (--eval-dataset)
        assert f"({flag}): " in err, err
    elif key not in ("dataset", "pad_lengths"):
        assert f"{flag}: " in err, err  # which flag
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", sorted(BOOLEANS) + ["epochs", "learning_rate", "model", "eval_dataset"])
def test_a_bad_toml_value_names_the_file(tmp_path, capsys, key):
    bad = {"epochs": '"ten"', "learning_rate": '"fast"', "model": "3", "eval_dataset": "3"}.get(key, '"yes"')
    (tmp_path / "run.toml").write_text(f'dataset = "builtin:digits"\n{key} = {bad}\n')
    err = _one_line(capsys, ["train", "--config", str(tmp_path / "run.toml")], tmp_path / "out")
    assert str(tmp_path / "run.toml") in err and key in err, err
