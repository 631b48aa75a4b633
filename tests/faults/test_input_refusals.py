"""Input that parses but makes no sense is refused before anything runs: exit 2, one line naming the flag or
file, the value and the fix, no traceback, nothing written.

Each case runs the real command (``python -m evenflow``) in a subprocess under a hard timeout, in an empty
working directory that must stay empty: an augmentation that would blank the images, counts past
`evenflow train`'s limits given to `evenflow inspect`, a learning rate, seed or batch past the run's range,
a number with a decimal point or exponent where a whole number is expected, a ``.npz`` of 0 rows, and
TFRecord files without their index.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evenflow.data import convert

SRC = Path(__file__).resolve().parents[2] / "src"
TOO_BIG = str(2**70)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    rng = np.random.default_rng(0)
    np.savez(root / "img.npz", x=rng.random((60, 8, 8, 1)).astype(np.float32), y=np.arange(60) % 3)
    np.savez(root / "empty.npz", x=np.zeros((0, 8, 8, 1), np.float32), y=np.zeros(0, np.int64))
    convert(str(root / "img.npz"), root / "rec", label_key="y")
    (root / "plain").mkdir()
    for name in ("a.tfrecord", "b.tfrecord"):  # TFRecord files without their .idx sidecars
        shutil.copy(next((root / "rec").glob("*.tfrecord")), root / "plain" / name)
    return root


def _evenflow(cwd: Path, *args, timeout: int = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(["timeout", "-k", "5", str(timeout), sys.executable, "-m", "evenflow", *map(str, args)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout + 30)


def _refused(run: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    err = run.stderr.strip()
    assert run.returncode == 2, (run.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"evenflow {command}: error: "), err
    for fragment in fragments:
        assert fragment in err, err
    return err


TRAIN = [
    # (flags, what the one line must hold)
    (["--augment", "crop=8"], ["--augment crop=8", "8 x 8 images", "at most crop=7"]),
    (["--augment", "flip,crop=100"], ["--augment crop=100", "8 x 8 images", "at most crop=7"]),
    (["--augment", "brightness=1e300"], ["--augment", "brightness must be a number in [0, 255]", "1e300"]),
    (["--augment", "brightness=inf"], ["--augment", "brightness must be a number in [0, 255]", "brightness=inf"]),
    (["--learning-rate", "1e300"], ["--learning-rate", "must be in [1e-10, 10000]", "1e+300"]),
    (["--learning-rate", "1e-300"], ["--learning-rate", "must be in [1e-10, 10000]", "1e-300"]),
    (["--seed", str(2**32)], ["--seed", "at most 4294967295", "4294967296"]),
    (["--seed", TOO_BIG], ["--seed", "at most 4294967295", TOO_BIG]),
    (["--global-batch-size", TOO_BIG], ["--global-batch-size", "at most 2147483647", TOO_BIG]),
    (["--replicas", "1e9"], ["--replicas takes a whole number, got '1e9'", "--replicas 1000000000"]),
    (["--epochs", "2.5"], ["--epochs takes a whole number, got '2.5'"]),
]


@pytest.mark.parametrize("flags,fragments", TRAIN, ids=[" ".join(f) for f, _ in TRAIN])
def test_train_refuses_values_that_parse_but_make_no_sense(data, tmp_path, flags, fragments):
    run = _evenflow(tmp_path, "train", "--framework", "torch", "--dataset", data / "img.npz", "--epochs", "1",
                    "--loader-workers", "0", *flags, "--output-dir", tmp_path / "out")
    _refused(run, "train", *fragments)
    assert not any(tmp_path.iterdir())


def test_train_refuses_a_npz_of_0_rows_naming_the_file_and_arrays(data, tmp_path):
    run = _evenflow(tmp_path, "train", "--framework", "torch", "--dataset", data / "empty.npz",
                    "--output-dir", tmp_path / "out")
    _refused(run, "train", f"{data / 'empty.npz'}: 0 samples in arrays x, y")
    assert not any(tmp_path.iterdir())


def test_the_tf_framework_refuses_a_crop_as_large_as_the_image_too(data, tmp_path):
    run = _evenflow(tmp_path, "train", "--framework", "tf", "--replicas", "1", "--dataset", data / "img.npz",
                    "--augment", "crop=8", "--epochs", "1", "--output-dir", tmp_path / "out", timeout=180)
    _refused(run, "train", "--augment crop=8", "at most crop=7")
    assert not any(tmp_path.iterdir())


INSPECT = [
    (["--replicas", "1000000", "--batch-size", "1000000", "--samples", "100"],
     ["--samples gives 100 samples but --replicas is 1,000,000", "use at most 100 replicas"]),
    (["--replicas", "100000", "--batch-size", "100000", "--samples", "100000000", "--steps", "0:1"],
     ["--replicas must be at most 65536, got 100000"]),
    (["--replicas", "1e9", "--batch-size", "1000", "--samples", "100"], ["--replicas takes a whole number"]),
    (["--replicas", "4", "--batch-size", "2.5", "--samples", "100"], ["--batch-size takes a whole number"]),
    (["--replicas", "0", "--batch-size", "8", "--samples", "100"], ["--replicas must be at least 1, got 0"]),
    (["--replicas", "4", "--batch-size", TOO_BIG, "--samples", "100"], ["--batch-size must be at most 2147483647"]),
    (["--replicas", "4", "--batch-size", "8", "--samples", TOO_BIG, "--steps", "0:1"],
     ["--samples must be at most 9007199254740992"]),
    (["--replicas", "4", "--batch-size", "8", "--samples", "100", "--seed", str(2**32)],
     ["--seed must be at most 4294967295", "4294967296"]),
    (["--replicas", "4", "--batch-size", "8", "--samples", "100", "--epoch", "-1"], ["--epoch must be at least 0"]),
    (["--replicas", "4", "--batch-size", "8", "--dataset", "builtin:stdlib-docs", "--pack", str(10**15)],
     ["--pack 1,000,000,000,000,000 is longer than all", "use --pack of at most"]),
]


@pytest.mark.parametrize("flags,fragments", INSPECT, ids=[" ".join(f) for f, _ in INSPECT])
def test_inspect_refuses_counts_past_trains_limits_first(tmp_path, flags, fragments):
    _refused(_evenflow(tmp_path, "inspect", *flags, timeout=60), "inspect", *fragments)
    assert not any(tmp_path.iterdir())


def test_inspect_names_every_tfrecord_file_without_its_index_and_the_fixes(data, tmp_path):
    run = _evenflow(tmp_path, "inspect", "--dataset", data / "plain", "--replicas", "4", "--batch-size", "8")
    a, b = data / "plain" / "a.tfrecord", data / "plain" / "b.tfrecord"
    _refused(run, "inspect", f"{a}, {b}: no .idx index", f"`evenflow index {a} {b} --label-key", "--samples N")
    assert not any(tmp_path.iterdir())


def test_inspect_takes_n_and_labels_from_a_npz_and_refuses_one_of_0_rows(data, tmp_path):
    run = _evenflow(tmp_path, "inspect", "--dataset", data / "img.npz", "--replicas", "4", "--batch-size", "8",
                    "--stratify", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["real_samples"] == 60  # every sample of the array, with its label (stratified)
    run = _evenflow(tmp_path, "inspect", "--dataset", data / "empty.npz", "--replicas", "4", "--batch-size", "8")
    _refused(run, "inspect", f"{data / 'empty.npz'}: 0 samples in array y")
    run = _evenflow(tmp_path, "inspect", "--dataset", data / "img.npz", "--replicas", "100", "--batch-size", "100")
    _refused(run, "inspect", f"{data / 'img.npz'} holds 60 samples but --replicas is 100")


def test_the_python_api_refuses_the_same_augmentations():
    from evenflow.data.augment import from_policy
    from evenflow.data.augment_policy import check_fits
    from evenflow.run.data_options import DataOptions
    from evenflow.tf.input.augment import from_policy as tf_from_policy  # refuses before TensorFlow is imported

    for policy in ("brightness=1e300", "brightness=inf"):
        with pytest.raises(ValueError, match=r"brightness must be a number in \[0, 255\]"):
            DataOptions(dataset="builtin:digits", augment=policy)
    for fits in (check_fits, from_policy, tf_from_policy):
        with pytest.raises(ValueError, match="at most crop=7"):
            fits("crop=8", (8, 8, 1))
    assert check_fits("crop=7", (8, 8)) == (("crop", "7"),)
    assert from_policy("crop=7", (8, 8, 1)).steps == (("crop", 7),)
