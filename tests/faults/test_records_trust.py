"""Every file the records layer reads back is checked against the file it describes or a digest written
with it: stale or damaged sidecars, a shard listed twice or copied, and manifests without shards are one
line naming the file and the fix; ``evenflow index`` counts what a damaged file lost as training does."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import convert
from evenflow.records import (ExampleEncoder, RecordDataset, RecordError, RecordWriter, decode_examples, index_file,
                              iter_records)
from evenflow.records.fingerprint import sample_positions
from evenflow.records.manifest import read_manifest

SRC = Path(__file__).resolve().parents[2] / "src"
N = 400  # samples; 2 shards of 200 records, more than the ~66 sampled on open


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.normal(size=(N, 8)).astype(np.float32), y=rng.integers(0, 4, N))
    return root / "d.npz"


@pytest.fixture
def rec(source, tmp_path):
    out = tmp_path / "rec"
    convert(str(source), out, shards=2, label_key="y")
    return out


def _shards(root) -> list[str]:
    return [os.path.join(root, s.file) for s in read_manifest(root).shards]


def _evenflow(*args, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(["timeout", "-k", "5", str(timeout), sys.executable, "-m", "evenflow", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=timeout + 30)


def _train(capsys, root, run, *extra) -> tuple[int, str, str]:
    code = main(["train", "--framework", "torch", "--dataset", str(root), "--epochs", "1", "--loader-workers", "0",
                 "--output-dir", str(run), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str, command: str = "train") -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"evenflow {command}: error: ") and "Traceback" not in err, err
    return lines[0]


def _relabel(shard: str, records=None) -> np.ndarray:
    """Rewrite ``shard`` with the labels of ``records`` (default all) shifted by one: the same size, the
    sidecars of the old records left in place. Returns the new labels."""
    features = read_manifest(os.path.dirname(shard)).features
    raw = list(iter_records(shard))
    cols = decode_examples(raw, features)
    change = np.arange(len(raw)) if records is None else np.asarray(records)
    cols["y"][change] = (cols["y"][change] + 1) % 4
    kept = {s: Path(shard + s).read_bytes() for s in (".idx", ".meta.npz")}
    size = os.path.getsize(shard)
    enc = ExampleEncoder(features)
    with RecordWriter(shard, write_index=False) as w:
        for j in range(len(raw)):
            w.write(enc.encode({k: cols[k][j] for k in features}))
    for suffix, data in kept.items():
        Path(shard + suffix).write_bytes(data)
    assert os.path.getsize(shard) == size
    return cols["y"]


# -- records rewritten at the same size: the sidecars' labels are stale ------------------------------------------


def test_records_rewritten_with_other_labels_are_refused_until_reindexed(rec, tmp_path):
    shard = _shards(rec)[0]
    labels = _relabel(shard)
    res = _evenflow("train", "--framework", "torch", "--loader-workers", "0", "--dataset", rec, "--epochs", "1",
                    "--output-dir", tmp_path / "run")
    assert res.returncode == 2, res.stderr
    line = _one_line(res.stderr)
    assert line.startswith(f"evenflow train: error: {shard} (record 0, offset 0): its sidecars ")
    assert "describe other records" in line and "rewritten at the same size" in line
    assert line.endswith(f"rebuild them with `evenflow index {shard} --label-key y`")
    assert not (tmp_path / "run").exists()
    res = _evenflow("index", shard, "--label-key", "y")
    assert res.returncode == 0, res.stderr
    assert RecordDataset(rec).labels[:200].tolist() == labels.tolist()


def test_one_record_rewritten_outside_the_sample_is_refused_at_the_start_of_training(rec, tmp_path, capsys):
    shard = _shards(rec)[0]
    record = int(np.setdiff1d(np.arange(200), sample_positions(200))[0])
    _relabel(shard, [record])
    RecordDataset(rec)  # the sampled records are unchanged: opening cheaply cannot tell
    with pytest.raises(RecordError, match="describe other records: the stored data CRCs of its records are not"):
        RecordDataset(rec, check="headers")
    code, _, err = _train(capsys, rec, tmp_path / "run")
    line = _one_line(err)
    assert code == 2 and line.startswith(f"evenflow train: error: {shard}: its sidecars ")
    assert f"`evenflow index {shard} --label-key y`" in line and not (tmp_path / "run").exists()


def test_reindexing_rewritten_records_without_a_label_key_drops_the_stale_labels(rec):
    shard = _shards(rec)[0]
    _relabel(shard)
    index_file(shard)  # the offsets are the same; the records are not
    with pytest.raises(RecordError, match=rf"names the label key 'y' but {shard}\.meta\.npz holds no label column; "
                                          rf"rebuild it with `evenflow index {shard} --label-key y`"):
        RecordDataset(rec)
    index_file(_shards(rec)[1])  # unchanged records keep the labels they had
    assert RecordDataset([_shards(rec)[1]]).labels is not None


def test_a_changed_index_that_still_tiles_its_file_is_refused(tmp_path):
    path = tmp_path / "v.tfrecord"
    sizes = [10 + (i % 7) for i in range(300)]
    with RecordWriter(path) as w:
        for i, n in enumerate(sizes):
            w.write(bytes([i % 256]) * n)
    k = next(i for i in range(1, 299) if sizes[i] != sizes[i + 1] and not np.isin([i, i + 1], sample_positions(300)).any())
    lines = (tmp_path / "v.tfrecord.idx").read_text().splitlines()
    off = int(lines[k].split()[0])
    a, b = sizes[k] + 16, sizes[k + 1] + 16
    lines[k], lines[k + 1] = f"{off} {b}", f"{off + b} {a}"  # two records' lengths swapped: it still tiles the file
    (tmp_path / "v.tfrecord.idx").write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError) as e:
        RecordDataset([str(path)])
    assert str(e.value) == (f"{path}: index {path}.idx does not match the file: it is not the index {path}.meta.npz "
                            f"was written with (the digest of its text differs): it was changed or replaced since; "
                            f"rebuild it with `evenflow index {path}`")


# -- damaged or old metadata --------------------------------------------------------------------------------------


def _edit_meta(path: str, change) -> None:
    with np.load(path, allow_pickle=False) as z:
        cols = {k: z[k] for k in z.files}
    change(cols)
    with open(path, "wb") as f:
        np.savez(f, **cols)


def _old_format(cols):
    for key in ("idx_digest", "sample_record", "sample_crc", "crc_digest", "checksum"):
        cols.pop(key, None)
    cols["format_version"] = np.int64(1)


def _labels_edited(cols):
    cols["label"] = cols["label"].copy()
    cols["label"][3] = (cols["label"][3] + 1) % 4


@pytest.mark.parametrize("damage, says", [
    ("labels_edited", "the index metadata's checksum does not match its columns: it was changed or damaged"),
    ("old_format", "index metadata of format 1, written by an older evenflow: it holds no digest"),
    ("byte_changed", "cannot read the index metadata"),
    ("truncated", "cannot read the index metadata"),
])
def test_a_damaged_or_old_meta_is_one_line_naming_it_and_the_fix(rec, tmp_path, capsys, damage, says):
    shard = _shards(rec)[1]
    meta = shard + ".meta.npz"
    if damage == "labels_edited":
        _edit_meta(meta, _labels_edited)
    elif damage == "old_format":
        _edit_meta(meta, _old_format)
    else:
        raw = bytearray(Path(meta).read_bytes())
        if damage == "truncated":
            raw = raw[:len(raw) // 2]
        else:
            raw[len(raw) // 3] ^= 0x20  # inside the label column's stored bytes
        Path(meta).write_bytes(bytes(raw))
    code, _, err = _train(capsys, rec, tmp_path / "run")
    line = _one_line(err)
    assert code == 2 and line.startswith(f"evenflow train: error: {meta}: ") and says in line, line
    assert f"`evenflow index {shard} --label-key y" in line and not (tmp_path / "run").exists()
    index_file(shard, label_key="y")  # the fix it names
    assert len(RecordDataset(rec)) == N


# -- a shard twice -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["same_name", "other_spelling", "link", "copy"])
def test_a_manifest_that_lists_a_shard_twice_is_refused(rec, tmp_path, capsys, how):
    m = json.loads((rec / "dataset.json").read_text())
    first = m["shards"][0]["file"]
    second = {"same_name": first, "other_spelling": f"./{first}", "link": "link.tfrecord",
              "copy": "copy.tfrecord"}[how]
    if how == "link":
        os.symlink(first, rec / second)
    if how == "copy":
        for suffix in ("", ".idx", ".meta.npz"):
            shutil.copyfile(rec / (first + suffix), rec / (second + suffix))
    m["shards"][1] = {**m["shards"][0], "file": second}
    (rec / "dataset.json").write_text(json.dumps(m))
    code, _, err = _train(capsys, rec, tmp_path / "run", "--audit")
    line = _one_line(err)
    assert code == 2 and not (tmp_path / "run").exists()
    if how == "copy":
        assert line == (f"evenflow train: error: {rec}/dataset.json: shards {rec}/{first} and {rec}/{second} hold the "
                        f"same records (the same size, record count and stored data CRCs at 66 sampled records): one "
                        f"is a copy of the other, so its records would be read twice per epoch; remove one of them")
    else:
        assert line == (f"evenflow train: error: {rec}/dataset.json: lists the shard {first!r} twice: entries 0 "
                        f"({first!r}) and 1 ({second!r}) are the same file, so its records would be read twice per "
                        f"epoch; remove entry 1 from the manifest")


def test_a_file_passed_twice_is_refused(rec):
    shard = _shards(rec)[0]
    with pytest.raises(RecordError, match=r"is the file .* again \(files 0 and 1 of the list are the same file\)"):
        RecordDataset([shard, os.path.join(os.path.dirname(shard), ".", os.path.basename(shard))])


def test_locate_tells_two_positions_that_are_the_same_record(rec, tmp_path, capsys):
    from evenflow.run.audit_ids import _checksum
    shard = os.path.abspath(_shards(rec)[0])
    ds = RecordDataset([shard])
    ids = np.arange(2 * len(ds), dtype=np.int64)  # what a dataset holding the shard twice trained
    arrays = {"dataset_ids": ids, "dataset": np.array(str(rec)), "kind": np.array("records"), "identity": np.array(""),
              "files": np.array([shard, os.path.join(os.path.dirname(shard), ".", os.path.basename(shard))]),
              "shard": (ids >= len(ds)).astype(np.int32), "record": ids % len(ds),
              "offset": np.concatenate([ds.sample_offset, ds.sample_offset])}
    arrays["checksum"] = np.array(_checksum(arrays))
    (tmp_path / "run" / "audit").mkdir(parents=True)
    np.savez(tmp_path / "run" / "audit" / "ids.npz", **arrays)
    assert main(["audit", str(tmp_path / "run"), "--locate", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["locations"][0]
    assert row["same_record_as"] == [3 + len(ds)]
    assert main(["audit", str(tmp_path / "run"), "--locate", "3"]) == 0
    assert (f"id 3 is the same record as id(s) {3 + len(ds)} ({shard}, offset {int(ds.sample_offset[3])}): the data "
            f"held it twice") in capsys.readouterr().out


# -- files that are missing or empty -------------------------------------------------------------------------------


def test_a_missing_meta_of_a_labelled_dataset_is_one_line_naming_it(rec, tmp_path):
    shard = _shards(rec)[0]
    os.remove(shard + ".meta.npz")
    res = _evenflow("train", "--framework", "torch", "--loader-workers", "0", "--dataset", rec, "--epochs", "1",
                    "--output-dir", tmp_path / "run")
    assert res.returncode == 2 and _one_line(res.stderr) == (
        f"evenflow train: error: {shard}: {rec}/dataset.json names the label key 'y' but its index metadata "
        f"{shard}.meta.npz is missing; rebuild it with `evenflow index {shard} --label-key y`")


@pytest.mark.parametrize("command", ["train", "inspect"])
def test_a_manifest_with_no_shards_is_one_line_naming_it(rec, tmp_path, command):
    m = json.loads((rec / "dataset.json").read_text())
    m["shards"] = []
    (rec / "dataset.json").write_text(json.dumps(m))
    extra = (["--framework", "torch", "--loader-workers", "0", "--epochs", "1", "--output-dir", tmp_path / "run"]
             if command == "train" else ["--replicas", "2", "--batch-size", "8"])
    res = _evenflow(command, "--dataset", rec, *extra)
    assert res.returncode == 2 and _one_line(res.stderr, command) == (
        f"evenflow {command}: error: {rec}/dataset.json: lists no shards, so the dataset holds no records; restore its "
        f"\"shards\" entries, or convert the data again into an empty directory (`evenflow convert SOURCE DIR`)")


# -- evenflow index --skip-corrupt counts what train counts ----------------------------------------------------------


def _zero_stretch(root, first: int, last: int) -> tuple[str, int]:
    """Zero shard 0 from inside record ``first``'s header to inside record ``last``'s footer; returns the
    shard and the bytes of those records."""
    ds = RecordDataset(root)
    _, offsets, lengths = ds.locate(np.arange(len(ds)))
    start, stop = int(offsets[first]) + 7, int(offsets[last] + lengths[last]) - 3
    shard = ds.shards[0].path
    raw = bytearray(Path(shard).read_bytes())
    raw[start:stop] = bytes(stop - start)
    Path(shard).write_bytes(bytes(raw))
    return shard, int(lengths[first:last + 1].sum())


def test_index_skip_corrupt_counts_the_records_and_bytes_train_counts(rec, tmp_path, capsys):
    shard, lost = _zero_stretch(rec, 30, 86)  # 57 records
    code, out, _ = _train(capsys, rec, tmp_path / "run", "--skip-corrupt")
    trained = [line.strip() for line in out.splitlines() if "bad records" in line or line.startswith(f"  {shard}:")]
    assert code == 0 and trained[0].startswith(f"skipped 57 bad records ({lost:,} bytes) in 1 file(s); summary.json")
    res = _evenflow("index", shard, "--verify", "--skip-corrupt")
    assert res.returncode == 0, res.stderr
    said = [line.removeprefix("evenflow index:").strip() for line in res.stderr.strip().splitlines()]
    assert said == [trained[0].replace("summary.json", "--json"), trained[1]]
    row = next(line.split() for line in res.stdout.splitlines() if line.startswith(shard))
    assert row[:4] == [shard, "143", str(os.path.getsize(shard)), "57"]  # records kept, bytes, records left out
    report = json.loads(_evenflow("index", shard, "--verify", "--skip-corrupt", "--json").stdout)  # again: the same
    assert report["num_bad"] == 57 and report["bytes_lost"] == lost and report["files"][0]["counted_by_index"]
    index_file(shard, label_key="y", skip_corrupt=True)
    code, out, err = _train(capsys, rec, tmp_path / "run2", "--audit")  # the manifest counts what the index left out
    assert code == 0, err
    assert f"{shard}: its index leaves 57 corrupt records out (evenflow index --skip-corrupt)" in out
    from evenflow.run.audit_ids import read_id_map
    ids = read_id_map(tmp_path / "run2")  # record numbers in the file, counting the ones the index left out
    mine = ids["shard"] == 0
    assert np.array_equal(ids["offset"][mine], ids["record"][mine] * (os.path.getsize(shard) // 200))
    assert not np.isin(ids["record"][mine], np.arange(30, 87)).any()


def test_index_skip_corrupt_without_an_earlier_index_says_how_it_counted(rec):
    shard, lost = _zero_stretch(rec, 30, 86)
    os.remove(shard + ".idx")
    res = _evenflow("index", shard, "--verify", "--skip-corrupt")
    assert res.returncode == 0
    assert res.stderr.strip().splitlines() == [
        f"evenflow index: skipped 1 bad records ({lost:,} bytes) in 1 file(s); --json lists each one",
        f"evenflow index:   {shard}: 1 records, {lost:,} bytes (1 length_crc); the first at record 30, offset "
        f"{30 * (os.path.getsize(shard) // 200)}",
        f"evenflow index: {shard} had no earlier index that places its records, so each damaged stretch counts as "
        f"one record (with all its bytes)"]
