"""`evenflow train` / `evenflow demo` from a records directory: end to end, augmentation, bad records.

Bad input found before training (keys, a missing index, an augmentation that does not fit
the data) is checked in this process: exit 2, one line, nothing written. Records that only
fail while training (an image that does not decode) and `--skip-corrupt` need TensorFlow's
devices, so they run the CLI in fresh processes.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from tests._warm import warm_python
from tests.records.records_helpers import break_image, flip_payload_byte

SRC = Path(__file__).resolve().parents[2] / "src"


def _cli(*argv, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    try:
        return subprocess.run([*warm_python(env), "-m", "evenflow", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"evenflow {' '.join(argv)} did not finish within {timeout} s")


def _convert(out: Path, *extra) -> Path:
    assert main(["convert", "builtin:digits", str(out), "--shards", "4", *extra]) == 0
    return out


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return _convert(tmp_path_factory.mktemp("rec") / "digits")


def _bad(tmp_path, capsys, *argv) -> str:
    out = tmp_path / "out"
    code = main([*argv, "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"evenflow {argv[0]}: error: "), err
    assert not out.exists()
    return err


def test_bad_keys_and_missing_index_exit_2_before_training(tmp_path, capsys, digits):
    err = _bad(tmp_path, capsys, "train", "--dataset", str(digits), "--feature-key", "pixels")
    assert f"{digits}/dataset.json" in err and "feature key 'pixels' is not in the records" in err
    err = _bad(tmp_path, capsys, "train", "--dataset", str(digits), "--label-key", "klass")
    assert "label_key 'klass' is not in the records" in err
    err = _bad(tmp_path, capsys, "demo", "--dataset", str(tmp_path))  # a directory without dataset.json
    assert "without dataset.json" in err and "evenflow convert" in err
    broken = _convert(tmp_path / "broken")
    shard = sorted(broken.glob("*.tfrecord"))[2]
    os.remove(f"{shard}.idx")
    err = _bad(tmp_path, capsys, "train", "--dataset", str(broken))
    assert f"{shard}: missing index" in err and "evenflow index" in err


def test_augment_must_fit_the_data(tmp_path, capsys, digits):
    np.savez(tmp_path / "flat.npz", x=np.zeros((30, 5), np.float32), y=np.arange(30) % 2)
    err = _bad(tmp_path, capsys, "train", "--dataset", str(tmp_path / "flat.npz"), "--augment")
    assert "needs image features [H, W] or [H, W, C]" in err and "(5,)" in err
    err = _bad(tmp_path, capsys, "demo", "--augment", "crop=one")
    assert "--augment: augment crop takes an integer number of pixels" in err
    err = _bad(tmp_path, capsys, "train", "--dataset", str(digits), "--augment", "zoom")
    assert "augment must be 'none' or a comma list of crop" in err


@pytest.mark.slow
def test_train_and_demo_from_records(tmp_path, digits):
    proc = _cli("train", "--dataset", str(digits), "--epochs", "6", "--replicas", "2",
                "--output-dir", str(tmp_path / "float"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "float" / "summary.json").read_text())
    assert summary["test_samples"] == 359 and summary["test_accuracy"] >= 0.9, summary["test_accuracy"]  # 0.975
    assert "records (1797 in 4 shards" in summary["dataset"] and summary["augment"] == "none"
    # The demo on the same digits stored as 32x32 JPEGs, augmented (training batches only).
    jpeg = _convert(tmp_path / "jpeg", "--image-format", "jpeg")
    proc = _cli("demo", "--dataset", str(jpeg), "--augment", "--epochs", "8", "--output-dir", str(tmp_path / "aug"))
    assert proc.returncode == 0, proc.stderr
    assert "augmenting training batches only: crop,rotate" in proc.stdout
    summary = json.loads((tmp_path / "aug" / "summary.json").read_text())
    assert summary["augment"] == "crop,rotate" and summary["test_samples"] == 359
    assert summary["test_accuracy"] >= 0.85, summary["test_accuracy"]  # 0.891 measured in 8 epochs


def test_bad_records_named_or_skipped(tmp_path):
    root = _convert(tmp_path / "jpeg", "--image-format", "jpeg")
    shards = sorted(root.glob("*.tfrecord"))
    image_off = break_image(root, 1, 7)
    # Found only when TensorFlow decodes it, mid-epoch: one line naming file, record and offset.
    proc = _cli("train", "--dataset", str(root), "--epochs", "1", "--replicas", "2",
                "--output-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"evenflow train: error: {shards[1]} (record 7, offset {image_off}): image 'image' "
                           f"does not decode"), last
    assert "Traceback" not in proc.stderr
    # --skip-corrupt: every CRC and image is checked first; bad records are left out and listed.
    crc_off = flip_payload_byte(root, 3, 2)
    proc = _cli("train", "--dataset", str(root), "--epochs", "1", "--replicas", "2", "--skip-corrupt",
                "--output-dir", str(tmp_path / "skip"))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 2 bad records" in proc.stdout
    summary = json.loads((tmp_path / "skip" / "summary.json").read_text())
    got = sorted((s["path"], s["record"], s["offset"], s["kind"]) for s in summary["skipped_records"])
    assert got == sorted([(str(shards[3]), 2, crc_off, "data_crc"), (str(shards[1]), 7, image_off, "image")])
    assert summary["test_samples"] + summary["plan"]["real_samples"] == 1797 - 2
