"""`evenflow convert` and `evenflow index` in-process: exit codes, one-line errors, no leftovers."""
import json
import os

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main
from evenflow.records import RecordDataset


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_has_examples(capsys):
    for cmd in ("convert", "index"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and f"evenflow {cmd} " in out


def test_convert_and_index_ok(tmp_path, capsys):
    code, out, err = run(capsys, "convert", "builtin:digits", str(tmp_path / "d"), "--shards", "3")
    assert code == 0 and "wrote 1797 records in 3 shards" in out and err == ""
    shards = sorted(str(p) for p in (tmp_path / "d").glob("*.tfrecord"))
    code, out, err = run(capsys, "index", *shards, "--verify", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["num_records"] == 1797 and report["num_bad"] == 0
    # Re-indexing kept the label column that convert stored.
    assert ef.Index.from_records(tmp_path / "d").num_classes == 10
    # One Index class: the planner's, whose from_records reads through the records layer.
    from evenflow.plan import Index
    assert ef.Index is Index and Index.from_records(shards) == ef.Index.from_records(tmp_path / "d")


def test_convert_json(tmp_path, capsys):
    np.savez(tmp_path / "a.npz", x=np.ones((4, 2)), y=np.arange(4))
    code, out, _ = run(capsys, "convert", str(tmp_path / "a.npz"), str(tmp_path / "o"), "--label-key", "y", "--json")
    assert code == 0 and json.loads(out)["num_samples"] == 4


def test_convert_bad_image_exit_2_no_leftovers(tmp_path, capsys):
    from PIL import Image
    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    Image.new("L", (3, 3)).save(root / "a" / "ok.png")
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    code, out, err = run(capsys, "convert", str(root), str(tmp_path / "out"))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"evenflow convert: error: {root / 'a' / 'broken.jpg'}: image does not decode")
    assert sorted(os.listdir(tmp_path)) == ["imgs"]  # no OUT_DIR, no staging directory


def test_convert_refuses_non_empty_out_dir(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("")
    code, _, err = run(capsys, "convert", "builtin:digits", str(tmp_path / "o"))
    assert code == 2 and "is not empty" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path / "o") == ["x"]


def test_convert_missing_feature_key(tmp_path, capsys):
    np.savez(tmp_path / "a.npz", x=np.ones((4, 2)))
    code, _, err = run(capsys, "convert", str(tmp_path / "a.npz"), str(tmp_path / "o"), "--feature-key", "img")
    assert code == 2 and "feature key 'img' is not in the file; it holds x" in err
    assert not (tmp_path / "o").exists()


def _corrupt_shard(tmp_path):
    from evenflow.records import RecordWriter
    path = tmp_path / "c.tfrecord"
    with RecordWriter(path, write_index=False) as w:
        for i in range(6):
            w.write(bytes([i]) * 10)
    raw = bytearray(path.read_bytes())
    raw[2 * 26 + 12 + 3] ^= 0xFF  # a data byte of record 2 (26 bytes per framed record)
    raw[4 * 26 + 12 + 3] ^= 0xFF  # and of record 4
    path.write_bytes(bytes(raw))
    return str(path)


def test_index_verify_reports_bad_record(tmp_path, capsys):
    path = _corrupt_shard(tmp_path)
    code, _, _ = run(capsys, "index", path)  # without --verify only the framing is checked
    assert code == 0
    code, out, err = run(capsys, "index", path, "--verify")
    assert code == 2
    assert err.strip() == (f"evenflow index: error: {path} (record 2, offset 52): corrupted data: data CRC is "
                           f"{err.split('data CRC is ')[1].split(',')[0]}, computed "
                           f"{err.split('computed ')[1].split(' ')[0]} over 10 bytes")
    code, out, err = run(capsys, "index", path, "--verify", "--skip-corrupt", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["num_bad"] == 2 and report["num_records"] == 4
    assert [(b["record"], b["offset"]) for b in report["files"][0]["bad"]] == [(2, 52), (4, 104)]
    assert "evenflow index: skipped 2 bad records (52 bytes) in 1 file(s); --json lists each one" in err
    ds = RecordDataset(path)
    assert ds.read_batch([0, 1, 2, 3]) == [bytes([i]) * 10 for i in (0, 1, 3, 5)]


def test_index_missing_file_and_truncated(tmp_path, capsys):
    code, _, err = run(capsys, "index", str(tmp_path / "nope.tfrecord"))
    assert code == 2 and "nope.tfrecord: no such file" in err
    code, _, err = run(capsys, "index", str(tmp_path))
    assert code == 2 and f"{tmp_path}: is a folder; pass its TFRecord files, e.g. {tmp_path}/*.tfrecord" in err
    path = _corrupt_shard(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(26 * 3 + 5)
    code, _, err = run(capsys, "index", path)
    assert code == 2 and f"{path} (record 3, offset 78): truncated file" in err
    code, out, err = run(capsys, "index", path, "--skip-corrupt")
    assert code == 0 and "skipped: " in out and "record 3, offset 78" in out
