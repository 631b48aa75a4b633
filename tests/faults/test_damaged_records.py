"""Damaged record files: every lost record is counted and named, and bad files are one line, not a traceback."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import convert
from evenflow.records import RecordDataset


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    rng = np.random.default_rng(0)
    n = 4000
    np.savez(root / "d.npz", x=rng.normal(size=(n, 16)).astype(np.float32), y=rng.integers(0, 4, n))
    return root


def _fresh(records, tmp_path):
    out = tmp_path / "rec"
    convert(str(records / "d.npz"), out, shards=2, label_key="y")
    return out, sorted(out.glob("*.tfrecord"))


def test_a_zeroed_stretch_loses_every_record_it_held_and_says_how_many(records, tmp_path, capsys):
    out, shards = _fresh(records, tmp_path)
    ds = RecordDataset(out)
    first, last = 300, 1400  # records of shard 0 wiped out, byte range from the index
    _, offsets, lengths = ds.locate(np.arange(ds.num_samples))
    start = int(offsets[first]) + 7                       # inside record 300's header
    stop = int(offsets[last] + lengths[last]) - 3         # inside record 1400's footer
    raw = bytearray(shards[0].read_bytes())
    raw[start:stop] = bytes(stop - start)
    shards[0].write_bytes(bytes(raw))
    damaged = RecordDataset(out, skip_corrupt=True)
    assert sorted(b.record for b in damaged.bad) == list(range(first, last + 1))
    assert sum(b.length for b in damaged.bad) == int((lengths[first:last + 1]).sum())
    assert damaged.num_samples == ds.num_samples - (last - first + 1)
    code = main(["train", "--framework", "torch", "--dataset", str(out), "--skip-corrupt", "--epochs", "1",
                 "--loader-workers", "0", "--output-dir", str(tmp_path / "run")])
    text = capsys.readouterr().out
    assert code == 0
    assert f"skipped {last - first + 1:,} bad records" in text
    assert f"{shards[0]}: {last - first + 1:,} records" in text and "lost" in text


@pytest.mark.parametrize("where", ["header", "payload", "footer", "tail"])
def test_without_skip_corrupt_a_damaged_file_is_one_line_naming_it(records, tmp_path, capsys, where):
    out, shards = _fresh(records, tmp_path)
    ds = RecordDataset(out)
    _, offsets, lengths = ds.locate([10])
    raw = bytearray(shards[0].read_bytes())
    at = {"header": int(offsets[0]) + 2, "payload": int(offsets[0]) + 20,
          "footer": int(offsets[0] + lengths[0]) - 2}.get(where)
    if at is None:
        raw = raw[:-5]  # the file cut short
    else:
        raw[at] ^= 0xFF
    shards[0].write_bytes(bytes(raw))
    code = main(["train", "--framework", "torch", "--dataset", str(out), "--epochs", "1", "--loader-workers", "0",
                 "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"evenflow train: error: {shards[0]}") and "Traceback" not in err
    assert "--skip-corrupt" in err or "evenflow index" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["idx_garbage", "idx_offset", "idx_missing", "manifest_json", "manifest_count",
                                    "length_crc"])
def test_a_damaged_sidecar_or_header_is_one_line_naming_the_file(records, tmp_path, capsys, damage):
    out, shards = _fresh(records, tmp_path)
    idx = shards[0].with_name(shards[0].name + ".idx")
    manifest = out / "dataset.json"
    if damage == "idx_garbage":
        idx.write_text(idx.read_text().replace("\n", "\nnot numbers\n", 1))
    elif damage == "idx_offset":
        lines = idx.read_text().splitlines()
        lines[3] = f"{int(lines[3].split()[0]) + 1} {lines[3].split()[1]}"
        idx.write_text("\n".join(lines) + "\n")
    elif damage == "idx_missing":
        idx.unlink()
    elif damage == "manifest_json":
        manifest.write_text(manifest.read_text()[:40])
    elif damage == "manifest_count":
        manifest.write_text(manifest.read_text().replace('"num_records": ', '"num_records": 1', 1))
    else:
        raw = bytearray(shards[0].read_bytes())
        raw[9] ^= 0x01  # the first record's length CRC
        shards[0].write_bytes(bytes(raw))
    code = main(["train", "--framework", "torch", "--dataset", str(out), "--epochs", "1", "--loader-workers", "0",
                 "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and err.startswith("evenflow train: error: ")
    named = {"manifest_json": str(manifest), "manifest_count": str(manifest)}.get(damage, str(shards[0]))
    assert named in err, err
    assert not (tmp_path / "run").exists()
