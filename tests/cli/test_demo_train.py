"""End-to-end ``evenflow demo`` / ``evenflow train`` runs, and bad input: exit 2, one line, nothing written."""
from __future__ import annotations

import re

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from tests._warm import warm_python

SRC = Path(__file__).resolve().parents[2] / "src"


def _cli(*argv, timeout=240):
    """Run the CLI in a process of its own (TensorFlow's devices are per process).

    TF_CPP_MIN_LOG_LEVEL=2 is the level the CLI sets itself when none is set (tests/_warm.py imports
    TensorFlow under it before the CLI starts).
    """
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    try:
        return subprocess.run([*warm_python(env), "-m", "evenflow", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"evenflow {' '.join(argv)} did not finish within {timeout} s")


def _events(run_dir: Path) -> dict[str, list[float]]:
    """tag -> values of the scalars in the run's TensorBoard event files."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow.core.util import event_pb2

    out: dict[str, list[float]] = {}
    for path in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(raw.numpy())
            for v in event.summary.value:
                out.setdefault(v.tag, []).append(float(tf.make_ndarray(v.tensor)))
    return out


@pytest.mark.slow
def test_demo_reaches_its_promised_accuracy(tmp_path):
    run_dir = tmp_path / "demo"
    proc = _cli("demo", "--output-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.95
    assert summary["test_samples"] == 359  # 20% of digits' 1797, every one counted once
    for key in ("final_train_loss", "samples_per_second", "replicas", "global_batch_size", "seed", "epochs", "plan"):
        assert key in summary
    assert summary["replicas"] == 4 and summary["plan"]["real_samples"] == 1438
    assert "per-replica balance" in proc.stdout and "test accuracy" in proc.stdout
    assert "samples/s" in proc.stderr  # the progress bars
    events = _events(run_dir)
    assert len(events["train/loss"]) == summary["epochs"]
    assert events["test/accuracy"] == [pytest.approx(summary["test_accuracy"], abs=1e-6)]
    assert sum(v[0] for k, v in events.items() if k.startswith("replica_real_samples/")) == 1438
    assert "train/samples_per_second" in events


@pytest.mark.slow
def test_train_from_a_toml_file_with_flag_overrides(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.random((120, 8, 8)).astype(np.float32)  # [H, W] images: cnn adds the channel axis
    labels = (images.mean(axis=(1, 2)) > 0.5).astype(np.int64)
    np.savez(tmp_path / "imgs.npz", pixels=images, target=labels)
    config = tmp_path / "run.toml"
    config.write_text(f'dataset = "{tmp_path / "imgs.npz"}"\nfeature_key = "pixels"\nlabel_key = "target"\n'
                      f'model = "cnn"\noptimizer = "sgd"\nlearning_rate = 0.05\nepochs = 5\nreplicas = 3\n'
                      f'global_batch_size = 20\nprecision = "mixed_bfloat16"\noutput_dir = "{tmp_path / "run"}"\n')
    proc = _cli("train", "--config", str(config), "--epochs", "2", "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["epochs"], summary["seed"], summary["replicas"]) == (2, 7, 3)  # flags won
    assert summary["config"]["model"] == "cnn" and summary["config"]["precision"] == "mixed_bfloat16"
    assert summary["test_samples"] == 24 and np.isfinite(summary["final_train_loss"])


@pytest.mark.slow
def test_mixed_float16_trains(tmp_path):
    proc = _cli("demo", "--epochs", "1", "--replicas", "2", "--precision", "mixed_float16",
                "--output-dir", str(tmp_path / "f16"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "f16" / "summary.json").read_text())
    assert np.isfinite(summary["final_train_loss"]) and summary["test_samples"] == 359


@pytest.mark.slow
def test_more_replicas_than_devices_writes_nothing(tmp_path):
    out = tmp_path / "never"
    proc = _cli("demo", "--replicas", "65", "--global-batch-size", "130", "--output-dir", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("evenflow demo: error: replicas")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def _bad(tmp_path, capsys, *argv) -> str:
    out = tmp_path / "out"
    code = main([*argv, "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"evenflow {argv[0]}: error: "), err
    assert not out.exists()
    return err


@pytest.mark.parametrize("argv,fragment", [
    (["train", "--dataset", "builtin:digits", "--model", "resnet"], "model must be one of cnn, hashed_text, mlp"),
    (["train", "--dataset", "builtin:cifar"], "builtins are builtin:digits"),
    (["train", "--dataset", "builtin:digits", "--precision", "fp8"], "precision must be one of"),
    (["train", "--dataset", "builtin:digits", "--optimizer", "lamb"], "optimizer must be one of"),
    (["train", "--dataset", "builtin:digits", "--replicas", "8", "--global-batch-size", "4"],
     "global_batch_size must be at least the number of replicas"),
    (["train", "--epochs", "2"], "missing config key 'dataset'"),
    (["demo", "--epochs", "0"], "--epochs: epochs must be at least 1"),
])
def test_bad_flags(tmp_path, capsys, argv, fragment):
    assert fragment in _bad(tmp_path, capsys, *argv)


@pytest.mark.parametrize("text,fragment", [
    ('dataset = "builtin:digits"\nbatch = 32\n', "unknown config key 'batch'"),
    ('dataset = "builtin:digits"\nepochs = 2.5\n', "epochs must be an integer"),
    ('dataset = builtin:digits\n', "not valid TOML"),
    ('model = "mlp"\n', "missing config key 'dataset'"),
])
def test_bad_config_files(tmp_path, capsys, text, fragment):
    config = tmp_path / "run.toml"
    config.write_text(text)
    assert fragment in _bad(tmp_path, capsys, "train", "--config", str(config))


def test_missing_config_file(tmp_path, capsys):
    assert "nope.toml" in _bad(tmp_path, capsys, "train", "--config", str(tmp_path / "nope.toml"))


def test_cnn_needs_image_shaped_features(tmp_path, capsys):
    np.savez(tmp_path / "flat.npz", x=np.zeros((30, 5), np.float32), y=np.arange(30) % 2)
    err = _bad(tmp_path, capsys, "train", "--dataset", str(tmp_path / "flat.npz"), "--model", "cnn")
    assert "model 'cnn' needs image-shaped features" in err


@pytest.mark.parametrize("command", ["demo", "train"])
def test_help_shows_example_commands(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert f"evenflow {command}" in text and "examples:" in text and "--replicas" in text


@pytest.mark.parametrize("command", ["audit", "convert", "demo", "index", "inspect", "launch", "report", "train"])
def test_help_examples_print_as_written_and_every_option_says_what_it_does(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    # An example continued on the next line keeps its backslash (a bare one in the source joins
    # the two lines into one with a run of spaces in it).
    for line in text.splitlines():
        if line.lstrip().startswith("evenflow ") and line.rstrip().endswith("\\"):
            continue
        assert not re.search(r"\S {4,}--", line), line
    # Every option has a help text: argparse prints an option without one as a bare line, not
    # followed by its help text (indented further) on the next line.
    options = text.split("options:")[1].split("\n\n")[0].splitlines()[1:]
    bare = [line.strip() for line, after in zip(options, options[1:] + [""])
            if re.fullmatch(r"  (-\S+ ?[A-Z_:]*,? ?)+", line) and not after.startswith(" " * 6)]
    assert not bare, bare
