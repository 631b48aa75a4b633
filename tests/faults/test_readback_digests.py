"""Every file of a run that evenflow reads back carries a digest written with it, checked on every read:
audit segments (a ``checksum`` array), telemetry lines (a ``crc`` field) and ``summary.json`` (a
``checksum`` key). A changed value is one line naming the file (and line) and what to do, never a
silently wrong figure; files written before they carried a digest are read unchecked."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.plan import Cursor
from evenflow.run.audit import AUDIT_DIR, AuditLog, check_audit
from evenflow.run.audit_ids import ID_MAP
from evenflow.util.files import line_crc, line_with_crc, read_json_checked, read_npz, write_atomic

pytest.importorskip("torch")
SRC = Path(__file__).resolve().parents[2] / "src"
SEGMENT = "e00000-s000000-000019-w000.npz"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run: 2 epochs of 23 steps, the audit in 2 segments per epoch, telemetry, summary.json."""
    run_dir = tmp_path_factory.mktemp("digests") / "run"
    subprocess.run([sys.executable, "-m", "evenflow", "train", "--framework", "torch", "--dataset",
                    "builtin:digits", "--epochs", "2", "--loader-workers", "0", "--audit", "--checkpoint-every",
                    "20", "--output-dir", str(run_dir)], env=dict(os.environ, PYTHONPATH=str(SRC)), check=True,
                   timeout=240, stdout=subprocess.DEVNULL)
    return run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def _rewrite(path: Path, **changes) -> None:
    """Save ``path``'s arrays again with ``changes``, as a tool that edits an .npz would (zip CRCs all valid)."""
    arrays = {**read_npz(path), **changes}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def _one_error_line(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err.strip()


# -- audit segments ---------------------------------------------------------------------------------
def test_an_id_changed_inside_a_segment_is_named_not_counted(run, capsys):
    path = run / AUDIT_DIR / SEGMENT
    ids = read_npz(path)["ids"]
    ids[0, 0, 0] = ids[0, 0, 1]  # one sample now reads as a second copy of its neighbour
    _rewrite(path, ids=ids)
    assert _one_error_line(capsys, ["audit", str(run)]) == (
        f"evenflow audit: error: {path}: its checksum does not match its content (the file was changed or "
        f"damaged); delete it (the audit then counts its steps as not recorded) or rerun the training with --audit")
    path.unlink()  # the fix the line names
    assert main(["audit", str(run)]) == 1
    assert "epoch 0: only 3 of 23 steps recorded" in capsys.readouterr().out


@pytest.mark.parametrize("field", ["flags", "method"])
def test_a_changed_zip_header_byte_is_one_line_not_a_traceback(run, capsys, field):
    path = run / AUDIT_DIR / SEGMENT
    raw = bytearray(path.read_bytes())
    entry = raw.index(b"PK\x01\x02")  # the first member's entry in the zip's central directory
    raw[entry + (8 if field == "flags" else 10)] ^= 0x01  # "encrypted", or an unknown compression method
    path.write_bytes(bytes(raw))
    err = _one_error_line(capsys, ["audit", str(run)])
    assert err.startswith(f"evenflow audit: error: {path}: not a readable audit segment (BadZipFile: damaged zip "
                          f"header") and err.endswith("delete it (the audit then counts its steps as not recorded) "
                                                      "or rerun the training with --audit")


def test_the_id_map_with_a_changed_zip_header_byte_is_one_line(run, capsys):
    path = run / AUDIT_DIR / ID_MAP
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"PK\x01\x02") + 8] ^= 0x01
    path.write_bytes(bytes(raw))
    err = _one_error_line(capsys, ["audit", str(run), "--locate", "3"])
    assert err.startswith(f"evenflow audit: error: {path}: not a readable id map (BadZipFile: damaged zip header")


def test_a_renamed_segment_is_named_by_what_it_holds(run, capsys):
    path = run / AUDIT_DIR / SEGMENT
    moved = path.with_name("e00001-s000000-000019-w000.npz")
    (run / AUDIT_DIR / moved.name).unlink()
    path.rename(moved)  # epoch 0's steps under epoch 1's name: a resume's trim goes by the name
    assert _one_error_line(capsys, ["audit", str(run)]) == (
        f"evenflow audit: error: {moved}: its name says epoch 1, steps 0-19, but it holds epoch 0, steps 0-19 (the "
        f"file was renamed or changed); delete it (the audit then counts its steps as not recorded) or rerun the "
        f"training with --audit")


def test_a_resume_refuses_a_changed_segment_across_its_point_and_rewrites_a_checked_head(tmp_path):
    log = AuditLog(tmp_path, num_samples=8, num_steps=4, num_replicas=2)
    for step in range(4):
        log.record(0, step, np.arange(2), np.array([[2 * step], [2 * step + 1]]), False)
    log.flush()
    path = tmp_path / AUDIT_DIR / "e00000-s000000-000003-w000.npz"
    good = path.read_bytes()
    _rewrite(path, skipped=np.array([False, True, False, False]))
    with pytest.raises(ValueError, match=rf"^{path}: its checksum does not match its content \(the file was changed "
                                         r"or damaged\), and it holds steps on both sides of the resume point \(epoch "
                                         r"0, step 2\); delete it \(the audit then counts its steps before that point "
                                         r"as not recorded\) and resume again$"):
        log.trim(Cursor(0, 2))
    assert path.read_bytes() != good and path.exists()  # nothing changed
    path.write_bytes(good)
    assert log.trim(Cursor(0, 2)) == 2
    head = tmp_path / AUDIT_DIR / "e00000-s000000-000001-w000.npz"
    assert "checksum" in read_npz(head) and check_audit(tmp_path)[0].steps_recorded == 2


def test_a_segment_written_before_segments_had_a_checksum_is_read_unchecked(tmp_path):
    log = AuditLog(tmp_path, num_samples=4, num_steps=2, num_replicas=1)
    for step in range(2):
        log.record(0, step, np.arange(1), np.array([[2 * step, 2 * step + 1]]), False)
    log.flush()
    path = tmp_path / AUDIT_DIR / "e00000-s000000-000001-w000.npz"
    arrays = read_npz(path)
    del arrays["checksum"]
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, buf.getvalue())
    assert check_audit(tmp_path)[0].clean


# -- telemetry.jsonl --------------------------------------------------------------------------------
def _report(run, capsys) -> tuple[int, str]:
    code = main(["report", str(run)])
    return code, capsys.readouterr().out


def _samples_total(out: str) -> int:
    return int(out.splitlines()[2].split()[1])  # the replica table's first row


def test_a_changed_digit_in_a_telemetry_line_is_skipped_and_named(run, capsys):
    lines = (run / "telemetry.jsonl").read_text().splitlines()
    assert all(line_crc(x)[1] for x in lines)  # every line the run wrote carries a matching crc
    code, out = _report(run, capsys)
    assert code == 0 and _samples_total(out) == 2876 and "note: skipped" not in out
    assert '"samples": [64]' in lines[2]
    lines[2] = lines[2].replace('"samples": [64]', '"samples": [94]')
    (run / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
    code, out = _report(run, capsys)
    assert code == 0 and _samples_total(out) == 2876 - 64  # the changed update left out, not counted as 94
    assert (f"note: skipped line 3 of {run / 'telemetry.jsonl'}: its crc does not match its content (changed or "
            f"damaged), so the report leaves it out") in out.splitlines()
    assert "skipped line 3 of telemetry.jsonl" in (run / "report.html").read_text().replace(str(run) + "/", "")


def test_lines_that_lost_their_crc_are_counted(run, capsys):
    path = run / "telemetry.jsonl"
    lines = path.read_text().splitlines()
    for k in (4, 9):
        lines[k] = line_crc(lines[k])[0]  # valid JSON, but no crc where every line has one
    path.write_text("\n".join(lines) + "\n")
    code, out = _report(run, capsys)
    assert code == 0 and f"note: skipped 2 lines (5, 10) of {path}: their crcs do not match their content" in out


def test_a_cut_last_line_is_still_a_truncation_and_every_damaged_step_line_refuses(run, capsys):
    path = run / "telemetry.jsonl"
    text = path.read_text()
    path.write_text(text[:-40])  # the trainer died mid-write
    code, out = _report(run, capsys)
    n = len(text.splitlines())
    assert code == 0 and f"note: skipped line {n} of {path}: truncated" in out and "crc does not" not in out
    lines = text.splitlines()
    path.write_text("\n".join([lines[0]] + [x.replace('"kind": "step"', '"kind": "step" ') for x in lines[1:]]))
    err = _one_error_line(capsys, ["report", str(run)])
    assert err.startswith(f"evenflow report: error: {path} has no step line whose crc matches its content ({n - 1} "
                          f"lines (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...): changed or damaged)")


def test_a_telemetry_file_without_crcs_is_read_unchecked(run, capsys):
    path = run / "telemetry.jsonl"
    path.write_text("".join(line_crc(x)[0] + "\n" for x in path.read_text().splitlines()))
    code, out = _report(run, capsys)
    assert code == 0 and _samples_total(out) == 2876 and "note:" not in out


def test_the_json_line_crc_covers_every_byte_but_its_own_field():
    line = line_with_crc(json.dumps({"kind": "step", "compute": [0.25, 1e-5], "name": "é"}))
    assert line.endswith('"}') and json.loads(line)["crc"] == line[-10:-2] and line_crc(line)[1] is True
    for i in range(len(line) - len(', "crc": "00000000"}')):
        changed = line[:i] + chr(ord(line[i]) ^ 1) + line[i + 1:]
        assert line_crc(changed)[1] is False, changed
    assert line_crc(line_with_crc("{}")) == ("{}", True)


def test_the_rebalancing_replay_refuses_a_changed_line(run):
    sys.path.insert(0, str(SRC.parent / "benchmarks"))
    try:
        from replay_decisions import replay
    finally:
        sys.path.remove(str(SRC.parent / "benchmarks"))
    from evenflow.plan.speed.options import RebalanceOptions

    path = run / "telemetry.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"step": 2,', '"step": 3,')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match=rf"^{path}:4: its crc does not match its content"):
        replay(path, RebalanceOptions())


# -- summary.json -----------------------------------------------------------------------------------
def test_a_changed_summary_is_refused_by_the_audit_and_left_out_by_the_report(run, capsys):
    path = run / "summary.json"
    obj, ok = read_json_checked(path)
    assert ok is True and obj["epochs"] == 2
    path.write_text(path.read_text().replace('\n  "epochs": 2,', '\n  "epochs": 3,'))
    assert _one_error_line(capsys, ["audit", str(run)]) == (
        f"evenflow audit: error: {path}: its checksum does not match its content (the file was changed or "
        f"damaged), so the audit cannot tell how many epochs the run trained; restore it, or delete it to check the "
        f"recorded epochs only")
    code, out = _report(run, capsys)
    assert code == 0 and (f"note: {path}: its checksum does not match its content (the file was changed or "
                          f"damaged); the report leaves out its dataset and test results") in out
    assert obj["dataset"] not in (run / "report.html").read_text()
    path.unlink()
    assert main(["audit", str(run)]) == 0
    capsys.readouterr()


def test_a_reformatted_summary_still_matches(run):
    path = run / "summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4))  # another tool's spacing and key order
    assert read_json_checked(path)[1] is True


def test_an_unreadable_summary_is_named_by_the_audit(run, capsys):
    (run / "summary.json").write_text('{"epochs": 2')
    err = _one_error_line(capsys, ["audit", str(run)])
    assert err.startswith(f"evenflow audit: error: {run / 'summary.json'} cannot be read (")
