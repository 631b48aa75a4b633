"""`evenflow train` on plain TFRecord files (tf.io.TFRecordWriter, no dataset.json) after `evenflow index`.

Also: naming a corrupt JPEG re-decodes it without libjpeg's own stderr line.
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

tf = pytest.importorskip("tensorflow")

SRC = Path(__file__).resolve().parents[2] / "src"
N = 120


def _write_tfrecords(root: Path) -> np.ndarray:
    """Two files of tf.train.Examples written by TensorFlow itself: x (16 floats) and label (int64)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, N)
    for shard in range(2):
        with tf.io.TFRecordWriter(str(root / f"train-{shard}.tfrecord")) as w:
            for y in labels[shard * N // 2:(shard + 1) * N // 2].tolist():
                x = (rng.normal(size=16) + y).astype(np.float32)
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))})).SerializeToString())
    return labels


def test_index_then_train_on_plain_tfrecords(tmp_path, capsys):
    labels = _write_tfrecords(tmp_path)
    pattern = str(tmp_path / "train-*.tfrecord")
    # Without .idx sidecars: one line naming the first file and the command that fixes it; nothing written.
    code = main(["train", "--dataset", pattern, "--feature-key", "x", "--label-key", "label",
                 "--output-dir", str(tmp_path / "no-index")])
    err = capsys.readouterr().err.strip()
    first = tmp_path / "train-0.tfrecord"
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err == f"evenflow train: error: {first}: missing index {first}.idx; build it with `evenflow index {first}`"
    assert not (tmp_path / "no-index").exists()
    # `evenflow index FILES` (no --label-key: the labels are read from the records), then train.
    assert main(["index", *sorted(str(p) for p in tmp_path.glob("train-*.tfrecord"))]) == 0
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([*warm_python(env), "-m", "evenflow", "train", "--dataset", pattern, "--feature-key", "x",
                           "--label-key", "label", "--epochs", "1", "--replicas", "1",
                           "--output-dir", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    from evenflow.data import split_indices
    _, test = split_indices(labels, 0.2, 0)  # the split of the labels read from the records
    assert summary["test_samples"] == len(test) == 24
    assert summary["dataset"].startswith(f"{pattern}: TFRecord files ({N} in 2 shards")


def test_naming_a_corrupt_jpeg_prints_nothing_of_libjpeg(tmp_path, capfd):
    from evenflow.data import convert
    from evenflow.tf import RecordSource, decode_images, tf_source
    from tests.records.records_helpers import break_image

    root = tmp_path / "jpeg"
    convert("builtin:digits", root, shards=2, image_format="jpeg")
    offset = break_image(root, 1, 7)
    source = tf_source(RecordSource(root, decode=decode_images(channels=1, shape=(32, 32))))
    capfd.readouterr()
    error = source.find_bad_record()
    assert error is not None and error.record == 7 and error.offset == offset and error.kind == "image"
    # libjpeg writes "Improper call to JPEG library in state 201" on fd 2 for each failed decode.
    assert capfd.readouterr().err == ""
