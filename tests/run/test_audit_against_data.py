"""`evenflow audit RUN_DIR` checks the ids against the data, not only against themselves: with the run's
audit/ids.npz, two training positions that are the same sample of the data (the same record of the same
file, or the same dataset index) are a duplicate, named with the file and offset and the fix."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import convert
from evenflow.run.audit import AUDIT_DIR, AuditLog, check_audit
from evenflow.run.audit_ids import ID_MAP, read_id_map, save_id_map

N = 40  # samples: 2 shards of 20 records of the same size


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished torch run on records with --audit: 1 epoch, every sample once."""
    root = tmp_path_factory.mktemp("against")
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.normal(size=(N, 4)).astype(np.float32), y=rng.integers(0, 3, N))
    convert(str(root / "d.npz"), root / "rec", shards=2, label_key="y")
    code = main(["train", "--framework", "torch", "--loader-workers", "0", "--dataset", str(root / "rec"),
                 "--epochs", "1", "--test-fraction", "0", "--audit", "--output-dir", str(root / "run")])
    assert code == 0
    return root / "run"


def _audit(capsys, run, *extra) -> tuple[int, str]:
    code = main(["audit", str(run), *extra])
    out = capsys.readouterr()
    assert out.err == "", out.err
    return code, out.out


def test_a_clean_run_stays_clean_and_says_nothing_of_the_data(trained, capsys):
    code, out = _audit(capsys, trained)
    assert code == 0 and out.splitlines()[-2:] == [
        "    0     1/1            40          0       0        0        1  exactly once",
        "1 epoch: every sample exactly once"], out
    code, out = _audit(capsys, trained, "--json")
    (epoch,) = json.loads(out)["epochs"]
    assert code == 0 and epoch["clean"] and (epoch["num_data_duplicates"], epoch["data_duplicates"]) == (0, [])


def test_a_record_the_data_held_twice_fails_naming_the_ids_the_file_and_the_fix(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    # What an evenflow that read a manifest listing shard 0 twice wrote: positions 20..39 are its records again.
    arrays = read_id_map(run)
    first = arrays["shard"] == 0
    offset_of = dict(zip(arrays["record"][first].tolist(), arrays["offset"][first].tolist()))
    second = ~first
    arrays["offset"][second] = [offset_of[r] for r in arrays["record"][second].tolist()]
    arrays["files"] = np.array([arrays["files"][0], arrays["files"][0]])
    save_id_map(run, arrays)
    shard = str(arrays["files"][0])
    assert check_audit(run)[0].data_duplicates[:2] == [{"ids": [0, 20], "file": shard, "offset": offset_of[0]},
                                                       {"ids": [1, 21], "file": shard, "offset": offset_of[1]}]

    code, out = _audit(capsys, run, "--limit", "2")
    assert code == 1 and out.splitlines()[1:] == [
        "    0     1/1            40         20       0        0        1  NOT exactly once",
        f"epoch 0: 20 records of {shard} trained more than once, as ids 0 = 20 (offset 0), 1 = 21 (offset "
        f"{offset_of[1]}) ... (20 in all)",
        "the data held these records more than once (a shard listed twice in its manifest, or a file passed twice): "
        "remove the duplicate shard from the manifest and train again",
        "NOT clean: epoch 0 of 1 failed the exactly-once check"], out
    code, out = _audit(capsys, run, "--json", "--limit", "1")
    (epoch,) = json.loads(out)["epochs"]
    assert code == 1 and not epoch["clean"] and epoch["num_duplicates"] == 0
    assert epoch["num_data_duplicates"] == 20 and epoch["data_duplicates"] == [
        {"ids": [0, 20], "file": shard, "offset": 0}]


def _trail(run, steps: int = 4) -> None:
    """Epoch 0 of 4 steps on 2 replicas, N = 8, ids 0..7 in order; ``steps`` of them recorded."""
    log = AuditLog(run, num_samples=8, num_steps=4, num_replicas=2)
    for step in range(steps):
        log.record(0, step, np.arange(2), np.array([[2 * step], [2 * step + 1]]), False)
    log.flush()


def _array_map(run, dataset_ids) -> None:
    save_id_map(run, {"dataset_ids": np.asarray(dataset_ids, np.int64), "dataset": np.array("d.npz"),
                      "kind": np.array("npz"), "identity": np.array("")})


def test_a_sample_the_arrays_held_twice_fails_the_check(tmp_path, capsys):
    _trail(tmp_path)
    _array_map(tmp_path, [0, 1, 2, 3, 4, 5, 6, 3])  # positions 3 and 7 are row 3 of the arrays
    (report,) = check_audit(tmp_path)
    assert report.data_duplicates == [{"ids": [3, 7], "dataset_id": 3}] and not report.clean
    code, out = _audit(capsys, tmp_path)
    assert code == 1 and out.splitlines()[1:] == [
        "    0     4/4             8          1       0        0        2  NOT exactly once",
        "epoch 0: 1 samples of the data trained more than once, as ids 3 = 7 (dataset index 3)",
        "the data held these samples more than once: keep each sample once in the data and train again",
        "NOT clean: epoch 0 of 1 failed the exactly-once check"], out


def test_an_incomplete_epoch_that_trained_both_is_not_exactly_once(tmp_path, capsys):
    _trail(tmp_path, steps=2)  # ids 0..3
    _array_map(tmp_path, [0, 1, 2, 1, 4, 5, 6, 7])
    code, out = _audit(capsys, tmp_path)
    assert code == 1 and "  incomplete, NOT exactly once" in out.splitlines()[1]
    assert "epoch 0: 1 samples of the data trained more than once, as ids 1 = 3 (dataset index 1)" in out
    _array_map(tmp_path, [0, 1, 2, 3, 4, 5, 6, 1])  # 1 = 7, and 7 is not recorded yet
    assert check_audit(tmp_path)[0].data_duplicates == []
    (tmp_path / "summary.json").write_text('{"epochs": 2}')  # epoch 1 has no segment: nothing twice in it
    assert [e.data_duplicates for e in check_audit(tmp_path)] == [[], []]


def test_without_an_id_map_the_check_is_as_before_and_says_so_for_a_finished_train_run(tmp_path, capsys):
    _trail(tmp_path)  # as a Keras fit's audit: segments only
    code, out = _audit(capsys, tmp_path)
    assert code == 0 and "ids not checked" not in out and out.endswith("1 epoch: every sample exactly once\n")
    code, out = _audit(capsys, tmp_path, "--json")
    (epoch,) = json.loads(out)["epochs"]
    assert code == 0 and epoch["clean"] and (epoch["num_data_duplicates"], epoch["data_duplicates"]) == (None, None)
    (tmp_path / "summary.json").write_text('{"epochs": 1}')  # evenflow train's run, whose map is gone
    code, out = _audit(capsys, tmp_path)
    assert code == 0 and out.splitlines()[-2:] == [
        f"ids not checked against the data: {tmp_path / AUDIT_DIR / ID_MAP} is missing (evenflow train --audit "
        f"writes it), so a record the data held twice would not show", "1 epoch: every sample exactly once"]


@pytest.mark.parametrize("how", ["flipped", "other trail"])
def test_an_id_map_that_is_damaged_or_of_another_trail_is_one_line(tmp_path, capsys, how):
    _trail(tmp_path)
    path = tmp_path / AUDIT_DIR / ID_MAP
    if how == "flipped":
        _array_map(tmp_path, np.arange(8))
        raw = bytearray(path.read_bytes())
        raw[200] ^= 0xFF  # inside the first array's data: zip's CRC no longer matches
        path.write_bytes(bytes(raw))
        said = rf"{path}: not a readable id map \(BadZipFile: .*\); rerun the training with --audit to rewrite it"
    else:
        _array_map(tmp_path, np.arange(9))
        said = (rf"{path}: maps 9 training positions, but the audit segments hold ids of 8, so it is not this "
                rf"trail's map; rerun the training with --audit to rewrite it")
    assert main(["audit", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    pattern = rf"evenflow audit: error: {said}, or delete it to check the ids without tracing them to the data"
    assert re.fullmatch(pattern, err.strip()), err
