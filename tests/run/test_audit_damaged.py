"""A damaged audit file stops with one line naming it and what to do: the check, the id map, a
resume's trim; and a damaged cache of the built-in text dataset is parsed again."""
from __future__ import annotations

import json

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.plan import Cursor
from evenflow.run.audit import AUDIT_DIR, AuditLog, check_audit
from evenflow.run.audit_ids import ID_MAP, locate


def _damage(path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "truncated":
        raw = raw[:100]
    elif how == "flipped":  # a byte of the first member's data: its CRC no longer matches
        raw[200] ^= 0xFF
    else:
        raw = bytearray(b"not an npz\n")
    path.write_bytes(bytes(raw))


def _segments(tmp_path) -> list:
    """Epoch 0 of 4 steps on 2 replicas, N = 8, in two segments: steps 0-1 and 2-3."""
    log = AuditLog(tmp_path, num_samples=8, num_steps=4, num_replicas=2)
    for step in range(4):
        log.record(0, step, np.arange(2), np.array([[2 * step], [2 * step + 1]]), False)
        if step == 1:
            log.flush()
    log.flush()
    paths = sorted((tmp_path / AUDIT_DIR).glob("e*.npz"))
    assert [p.name for p in paths] == ["e00000-s000000-000001-w000.npz", "e00000-s000002-000003-w000.npz"]
    assert check_audit(tmp_path)[0].clean
    return paths


@pytest.mark.parametrize("how", ["truncated", "flipped", "text"])
def test_a_damaged_segment_is_named_by_the_check_and_the_cli(tmp_path, capsys, how):
    path = _segments(tmp_path)[1]
    _damage(path, how)
    with pytest.raises(ValueError, match=rf"^{path}: not a readable audit segment \(BadZipFile: .*\); delete it "
                                         r"\(the audit then counts its steps as not recorded\)"):
        check_audit(tmp_path)
    assert main(["audit", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"evenflow audit: error: {path}: not a readable audit segment")
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("locate_ids", [[], ["--locate", "3"]])
def test_a_run_directory_that_is_missing_or_a_file_is_named(tmp_path, capsys, locate_ids):
    (tmp_path / "file").write_text("x")
    for path, said in ((tmp_path / "file", "is not a folder"), (tmp_path / "missing", "does not exist")):
        assert main(["audit", str(path), *locate_ids]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.strip() == (f"evenflow audit: error: {path} {said}; pass the run directory of "
                                             f"evenflow train --audit (its --output-dir)")


@pytest.mark.parametrize("how", ["truncated", "text"])
def test_a_damaged_id_map_is_named(tmp_path, how):
    _segments(tmp_path)
    path = tmp_path / AUDIT_DIR / ID_MAP
    path.write_bytes(b"PK\x03\x04" + bytes(300) if how == "truncated" else b"not an npz\n")
    with pytest.raises(ValueError, match=rf"^{path}: not a readable id map \(BadZipFile: .*\); rerun the training "
                                         r"with --audit to rewrite it$"):
        locate(tmp_path, [3])


def test_a_resume_deletes_a_damaged_segment_past_its_cursor(tmp_path):
    first, second = _segments(tmp_path)
    _damage(second, "truncated")
    assert AuditLog(tmp_path, 8, 4, 2).trim(Cursor(0, 2)) == 2  # its two steps, from its name
    assert sorted((tmp_path / AUDIT_DIR).glob("e*.npz")) == [first]
    (report,) = check_audit(tmp_path)
    assert report.steps_recorded == 2 and not report.complete


def test_a_damaged_segment_across_the_cursor_stops_the_resume_and_changes_no_file(tmp_path):
    first, second = _segments(tmp_path)
    _damage(first, "flipped")
    before = {p: p.read_bytes() for p in (first, second)}
    with pytest.raises(ValueError, match=rf"^{first}: not a readable audit segment \(BadZipFile: .*\), and it holds "
                                         r"steps on both sides of the resume point \(epoch 0, step 1\); delete it"):
        AuditLog(tmp_path, 8, 4, 2).trim(Cursor(0, 1))
    assert {p: p.read_bytes() for p in sorted((tmp_path / AUDIT_DIR).glob("e*.npz"))} == before


def test_a_readable_segment_across_the_cursor_keeps_its_head(tmp_path):
    _segments(tmp_path)
    assert AuditLog(tmp_path, 8, 4, 2).trim(Cursor(0, 1)) == 3
    assert [p.name for p in sorted((tmp_path / AUDIT_DIR).glob("e*.npz"))] == ["e00000-s000000-000000-w000.npz"]
    assert check_audit(tmp_path)[0].samples == 2


def test_a_damaged_cache_of_the_builtin_text_dataset_is_parsed_again(tmp_path):
    import importlib

    stdlib_docs = importlib.import_module("evenflow.data.stdlib_docs")  # the module, not the function
    data = stdlib_docs.TextData(np.arange(6), np.array([0, 2, 6]), np.array([0, 1]), ("a", "b"), "tiny")
    path = str(tmp_path / "cache.npz")
    stdlib_docs._store_cached(path, data)
    assert stdlib_docs._load_cached(path).name == "tiny"
    _damage(tmp_path / "cache.npz", "truncated")
    assert stdlib_docs._load_cached(path) is None


def _epochs(tmp_path, epochs) -> None:
    """Whole epochs ``epochs`` of 2 steps on 2 replicas, N = 4, one segment each."""
    log = AuditLog(tmp_path, num_samples=4, num_steps=2, num_replicas=2)
    for epoch in epochs:
        for step in range(2):
            log.record(epoch, step, np.arange(2), np.array([[2 * step], [2 * step + 1]]), False)
        log.flush()


def test_an_epoch_whose_segments_are_gone_is_incomplete_not_skipped(tmp_path, capsys):
    # Epoch 1 of 0..2 deleted: a gap in the epochs recorded.
    _epochs(tmp_path / "gap", [0, 2])
    got = check_audit(tmp_path / "gap")
    assert [(e.epoch, e.steps_recorded, e.clean) for e in got] == [(0, 2, True), (1, 0, False), (2, 2, True)]
    assert main(["audit", str(tmp_path / "gap")]) == 1
    out = capsys.readouterr().out
    assert "epoch 1: only 0 of 2 steps recorded" in out and "NOT clean: epoch 1 of 3" in out
    # --json: an incomplete epoch counts no misses (its unrecorded ids are not known to be missed).
    assert main(["audit", str(tmp_path / "gap"), "--json"]) == 1
    epochs = json.loads(capsys.readouterr().out)["epochs"]
    assert [(e["complete"], e["num_misses"], e["misses"]) for e in epochs] == [(True, 0, []), (False, None, None),
                                                                               (True, 0, [])]
    # The last epochs of a finished run deleted: summary.json says how many it trained.
    _epochs(tmp_path / "tail", [0, 1])
    (tmp_path / "tail" / "summary.json").write_text('{"epochs": 4}')
    assert [(e.epoch, e.clean) for e in check_audit(tmp_path / "tail")] == [(0, True), (1, True), (2, False),
                                                                            (3, False)]
    assert main(["audit", str(tmp_path / "tail")]) == 1
    capsys.readouterr()
    (tmp_path / "tail" / "summary.json").write_text('{"epochs": 2}')
    assert main(["audit", str(tmp_path / "tail")]) == 0
    assert "2 epochs: every sample exactly once" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["\u00b2", "3,\u0663", "-1", "1.5"])
def test_locate_takes_ascii_digits_only(tmp_path, capsys, text):
    _epochs(tmp_path, [0])
    assert main(["audit", str(tmp_path), "--locate", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"evenflow audit: error: --locate takes sample ids >= 0, comma-separated, e.g. 17,240; got {text!r}"
