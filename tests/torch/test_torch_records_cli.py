"""`evenflow train --framework torch` on records: --augment, --skip-corrupt, a corrupt JPEG, plain TFRecord files."""
from __future__ import annotations

import json

import pytest

from evenflow.cli import main
from evenflow.data import convert
from tests.records.records_helpers import break_image, flip_payload_byte


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch-records") / "jpeg"
    convert("builtin:digits", root, shards=4, image_format="jpeg")
    return root


def _train(tmp_path, capsys, dataset, *flags):
    out = tmp_path / "run"
    code = main(["train", "--framework", "torch", "--dataset", str(dataset), "--epochs", "1", "--loader-workers",
                 "0", "--output-dir", str(out), *flags])
    std = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    return code, std.out, std.err, summary


def test_augment_is_applied_to_training_batches(tmp_path, capsys, jpeg):
    code, out, err, summary = _train(tmp_path, capsys, jpeg, "--model", "cnn", "--augment", "crop,flip,rotate",
                                     "--loader-workers", "1")
    assert code == 0, err
    assert "augmenting training batches only: crop,flip,rotate (keyed by seed 0, epoch, sample id)" in out
    assert summary["augment"] == "crop,flip,rotate" and summary["test_samples"] == 359
    assert "(32, 32, 1) (decoded images)" in summary["dataset"]


def test_skip_corrupt_leaves_out_and_lists_bad_records(tmp_path, capsys, jpeg):
    root = tmp_path / "jpeg"
    convert("builtin:digits", root, shards=4, image_format="jpeg")
    shards = sorted(str(p) for p in root.glob("*.tfrecord"))
    image_off = break_image(root, 1, 7)
    crc_off = flip_payload_byte(root, 3, 2)
    code, out, err, summary = _train(tmp_path, capsys, root, "--skip-corrupt")
    assert code == 0, err
    assert "skipped 2 bad records" in out
    got = sorted((s["path"], s["record"], s["offset"], s["kind"]) for s in summary["skipped_records"])
    assert got == sorted([(shards[3], 2, crc_off, "data_crc"), (shards[1], 7, image_off, "image")])
    assert summary["test_samples"] + summary["history"][0]["samples"] == 1797 - 2


@pytest.mark.parametrize("workers", ["0", "1"])
def test_corrupt_jpeg_is_one_line_on_stderr(tmp_path, capfd, jpeg, workers):
    # With loader worker processes torch re-raises the worker's error as a RuntimeError holding
    # its traceback; the CLI still prints the record's one line.
    root = tmp_path / "jpeg"
    convert("builtin:digits", root, shards=4, image_format="jpeg")
    shard = sorted(str(p) for p in root.glob("*.tfrecord"))[1]
    offset = break_image(root, 1, 7)
    capfd.readouterr()
    code, out, err, summary = _train(tmp_path, capfd, root, "--loader-workers", workers)  # capfd: fd 2 too
    assert code == 2 and summary is None
    assert len(err.strip().splitlines()) == 1, err  # Pillow's libjpeg handler prints nothing of its own
    assert err.startswith(f"evenflow train: error: {shard} (record 7, offset {offset}): image 'image' does not "
                          f"decode: OSError: "), err
    assert err.strip().endswith("; replace it, or leave such records out with --skip-corrupt"), err


def test_plain_tfrecords_and_missing_index(tmp_path, capsys, jpeg):
    # The shards of a converted dataset, copied without dataset.json: plain TFRecord files.
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in sorted(jpeg.glob("*.tfrecord")):
        (plain / p.name).write_bytes(p.read_bytes())
    code, out, err, summary = _train(tmp_path, capsys, plain, "--model", "cnn")
    first = sorted(str(p) for p in plain.glob("*.tfrecord"))[0]
    assert code == 2 and err.strip() == (f"evenflow train: error: {first}: missing index {first}.idx; build it "
                                         f"with `evenflow index {first}`")
    assert main(["index", *sorted(str(p) for p in plain.glob("*.tfrecord"))]) == 0
    code, out, err, summary = _train(tmp_path, capsys, str(plain / "*.tfrecord"), "--model", "cnn")
    assert code == 0, err
    assert summary["test_samples"] == 359  # labels read from the records: the split of the converted dataset


def test_text_records_and_pad_lengths_are_refused_with_the_tf_hint(tmp_path, capsys):
    docs = tmp_path / "docs"
    convert("builtin:stdlib-docs", docs, shards=1)
    code, out, err, summary = _train(tmp_path, capsys, docs)
    assert code == 2 and summary is None
    assert "is variable-length text, and text trains on TensorFlow only" in err, err
    code, out, err, summary = _train(tmp_path, capsys, "builtin:digits", "--pad-lengths", "64,512")
    assert code == 2 and "--pad-lengths 64,512 is not supported with --framework torch" in err, err


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_flipped_payload_byte_is_refused_naming_the_record(tmp_path, capfd, workers):
    # A record whose payload no longer matches its CRC (raw features: it would still decode) is never
    # trained on: the torch path checks every record's CRC the first time it reads it, like TensorFlow's.
    root = tmp_path / "raw"
    convert("builtin:digits", root, shards=2)
    shard = sorted(str(p) for p in root.glob("*.tfrecord"))[1]
    offset = flip_payload_byte(root, 1, 5)
    capfd.readouterr()
    code, out, err, summary = _train(tmp_path, capfd, root, "--loader-workers", workers)
    assert code == 2 and summary is None, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"evenflow train: error: {shard} (record 5, offset {offset})"), err
    assert "--skip-corrupt" in err and "CRC" in err
