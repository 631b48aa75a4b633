"""Config files and flags: flat TOML keys, flags override, every mistake a one-line ValueError/TypeError."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from evenflow.run.config import KEYS, TrainConfig, add_config_flags, flag_values, load_config
from evenflow.data import load_dataset, split_indices


def _toml(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_file_then_flags(tmp_path):
    path = _toml(tmp_path, 'dataset = "builtin:digits"\nmodel = "cnn"\nepochs = 3\nlearning_rate = 1\n'
                           'precision = "mixed_bfloat16"\nstratify = false\n')
    cfg = load_config(path, overrides={"epochs": 5, "replicas": None})
    assert isinstance(cfg, TrainConfig)
    assert (cfg.model.model, cfg.schedule.epochs, cfg.compute.replicas) == ("cnn", 5, 4)
    assert cfg.optimizer.learning_rate == 1.0 and isinstance(cfg.optimizer.learning_rate, float)
    assert cfg.compute.precision == "mixed_bfloat16" and cfg.schedule.stratify is False
    assert set(cfg.to_dict()) == set(KEYS)


def test_every_key_is_a_flag():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--dataset", "d.npz", "--learning-rate", "0.5", "--no-stratify", "--replicas", "2",
                              "--feature-key", "img", "--output-dir", "out"])
    values = flag_values(args)
    assert set(values) == set(KEYS)
    cfg = load_config(None, overrides=values)
    assert (cfg.data.dataset, cfg.data.feature_key, cfg.optimizer.learning_rate) == ("d.npz", "img", 0.5)
    assert cfg.schedule.stratify is False and cfg.compute.replicas == 2 and cfg.output.output_dir == "out"


@pytest.mark.parametrize("text,overrides,error,fragment", [
    # unknown key in the file, with a suggestion
    ('dataset = "builtin:digits"\nlearning_rte = 0.1\n', {}, ValueError, "did you mean 'learning_rate'"),
    # missing required key
    ('epochs = 3\n', {}, ValueError, "missing config key 'dataset'"),
    # malformed TOML
    ('dataset = "builtin:digits\n', {}, ValueError, "not valid TOML"),
    # tables are not part of the format
    ('[train]\nepochs = 3\n', {}, ValueError, "flat (no [tables])"),
    # wrong types, attributed to the file or the flag
    ('dataset = "builtin:digits"\nepochs = "3"\n', {}, TypeError, "run.toml: epochs must be an integer"),
    ('dataset = "builtin:digits"\nstratify = 1\n', {}, TypeError, "stratify must be true or false"),
    ('dataset = "builtin:digits"\n', {"learning_rate": -1.0}, ValueError, "--learning-rate: learning_rate must be"),
    # unknown names
    ('dataset = "builtin:digits"\nmodel = "resnet"\n', {}, ValueError, "model must be one of cnn, hashed_text, mlp"),
    ('dataset = "builtin:digits"\noptimizer = "rmsprop"\n', {}, ValueError, "optimizer must be one of adam, sgd"),
    ('dataset = "builtin:digits"\nprecision = "float16"\n', {}, ValueError, "precision must be one of"),
    ('dataset = "builtin:digits"\ntest_fraction = 1.0\n', {}, ValueError, "test_fraction must be in [0, 1)"),
    ('dataset = "builtin:digits"\nreplicas = 0\n', {}, ValueError, "replicas must be at least 1"),
])
def test_bad_configs_say_what_and_where(tmp_path, text, overrides, error, fragment):
    with pytest.raises(error) as info:
        load_config(_toml(tmp_path, text), overrides=overrides)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_a_folder_and_a_binary_file_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"config file .*nope.toml does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ValueError, match=r"config file .* is a folder; pass the TOML file of the run"):
        load_config(tmp_path)
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00epochs")
    with pytest.raises(ValueError, match="bin.toml: not valid TOML: not UTF-8 text"):
        load_config(tmp_path / "bin.toml")


def _data(tmp_path, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return load_config(None, overrides={"dataset": str(path), "label_key": "lab"}).data


def test_npz_dataset_loads_and_splits(tmp_path):
    x = np.arange(40 * 3, dtype=np.float64).reshape(40, 3)
    y = np.repeat(np.arange(4), 10)
    loaded = load_dataset(_data(tmp_path, x=x, lab=y))
    assert loaded.num_classes == 4 and loaded.feature_shape == (3,)
    assert loaded.train.num_samples + loaded.test.num_samples == 40 and loaded.test.num_samples == 8
    assert loaded.train.index().num_samples == loaded.train.num_samples


@pytest.mark.parametrize("arrays,fragment", [
    ({"x": np.zeros((4, 2)), "y": np.zeros(4, int)}, "has no array 'lab'; its arrays are x, y"),
    ({"x": np.zeros((4, 2)), "lab": np.zeros(4)}, "labels must be integers"),
    ({"x": np.zeros((4, 2)), "lab": np.array([0, 1, -1, 1])}, "got a label -1"),
    ({"x": np.zeros((4, 2)), "lab": np.zeros(4, int)}, "at least 2 classes"),
    ({"x": np.zeros(4), "lab": np.array([0, 1, 0, 1])}, "at least one feature axis"),
    ({"x": np.zeros((4, 2)), "lab": np.array([0, 1, 0])}, "labels must have shape"),
])
def test_bad_npz_files(tmp_path, arrays, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_dataset(_data(tmp_path, **arrays))


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.array([{"a": 1}] * 4, dtype=object), lab=np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="plain arrays"):
        load_dataset(load_config(None, overrides={"dataset": str(path), "label_key": "lab"}).data)


@pytest.mark.parametrize("name,fragment", [
    ("builtin:mnist", "builtins are builtin:digits"),
    ("nothing.npz", "does not exist"),
    ("data.csv", "a path ending in .npz"),
])
def test_unknown_datasets(name, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_dataset(load_config(None, overrides={"dataset": name}).data)


def test_a_directory_that_is_not_a_records_dataset_is_explained(tmp_path):
    with pytest.raises(ValueError, match="is a directory without dataset.json or \\*.tfrecord files, so not a "
                                         "records dataset; write one with `evenflow convert"):
        load_dataset(load_config(None, overrides={"dataset": str(tmp_path)}).data)


def test_split_is_stratified_and_a_partition():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1)
    train, test = split_indices(labels, 0.2, seed=3)
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(16))
    assert np.bincount(labels[test], minlength=3).tolist() == [2, 1, 0]  # the single '2' stays in training
    assert np.array_equal(split_indices(labels, 0.2, seed=3)[1], test)


def _python(code: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(src)),
                          capture_output=True, text=True, timeout=120)


def test_importing_evenflow_and_its_commands_does_not_import_tensorflow():
    proc = _python("import sys, evenflow, evenflow.tf, evenflow.run.job, evenflow.torch, evenflow.commands.train, "
                   "evenflow.commands.demo, evenflow.cli; "
                   "print(sorted(m for m in ('tensorflow', 'keras', 'sklearn', 'torch') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_missing_tensorflow_is_one_line_with_the_extra_to_install(tmp_path):
    proc = _python("import sys; sys.modules['tensorflow'] = None; from evenflow.cli import main; "
                   f"sys.exit(main(['demo', '--output-dir', {str(tmp_path / 'out')!r}]))")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "evenflow demo: error: evenflow.tf needs tensorflow, which is not installed; " \
                                  "run pip install 'evenflow[tf]' (or 'evenflow[tf-cpu]' for the CPU-only build)"
    assert not (tmp_path / "out").exists()
