"""Which checkpoint a resume trusts: digests of every file, unreadable ones never deleted, flags honoured or refused.

Each run is the real ``evenflow train`` in a subprocess (PyTorch with ``--loader-workers 0``
unless the case is TensorFlow's): one epoch of builtin:digits with a checkpoint every 5 steps
leaves ``ckpt-00000-000015``, ``ckpt-00000-000020`` and ``ckpt-00001-000000``; the test damages
some of them and runs the command again.
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

from evenflow.plan.cursor import Cursor
from evenflow.run.checkpoint_trust import agreement, seal
from tests._warm import warm_python

SRC = Path(__file__).resolve().parents[2] / "src"
TORCH = ["--framework", "torch", "--loader-workers", "0"]
COMMON = ["--dataset", "builtin:digits", "--checkpoint-every", "5", "--no-telemetry"]
NEWEST, BEFORE = "ckpt-00001-000000", "ckpt-00000-000020"


def _train(run_dir: Path, *extra: str, framework=TORCH) -> subprocess.CompletedProcess:
    # Started warm (tests/_warm.py) with the framework imported; TF_CPP_MIN_LOG_LEVEL=2 is the level the CLI sets.
    env = {**os.environ, "PYTHONPATH": str(SRC), "TF_CPP_MIN_LOG_LEVEL": "2"}
    python = warm_python(env, "torch" if framework is TORCH else "tensorflow")
    cmd = ["timeout", "-k", "5", "240", *python, "-m", "evenflow", "train", *framework, *COMMON, *extra,
           "--output-dir", str(run_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A torch run directory after one epoch (copied by each test)."""
    pytest.importorskip("torch")
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    first = _train(run_dir, "--epochs", "1", "--audit")
    assert first.returncode == 0, first.stderr[-2000:]
    return run_dir


def _copy(trained: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    return run_dir


def _names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _warning(path: Path) -> str:
    return f"evenflow train: warning: {path}: cannot be restored ("


@pytest.mark.parametrize("damage", ["meta", "state"])
def test_no_restorable_checkpoint_stops_with_exit_2_naming_them_and_deletes_nothing(trained, tmp_path, damage):
    run_dir = _copy(trained, tmp_path)
    for ckpt in (run_dir / "checkpoints").iterdir():
        if damage == "meta":
            (ckpt / "meta.json").write_text("garbage\n")
        else:  # weights truncated: meta.json intact
            (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:500])
    before = {p: p.read_bytes() for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
    again = _train(run_dir, "--epochs", "2", "--audit")
    err = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(err) == 1 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert err[0].startswith(f"evenflow train: error: output_dir {run_dir} holds 3 checkpoints, none of which can be "
                             f"restored (")
    assert all(name in err[0] for name in _names(run_dir)) and "--no-resume" in err[0]
    assert {p: p.read_bytes() for p in (run_dir / "checkpoints").rglob("*") if p.is_file()} == before
    fresh = _train(run_dir, "--epochs", "1", "--audit", "--no-resume")  # the fix the line names
    assert fresh.returncode == 0 and "resuming" not in fresh.stdout, fresh.stderr[-2000:]


def test_a_damaged_newest_meta_json_falls_back_saying_why_and_is_never_deleted(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    newest = run_dir / "checkpoints" / NEWEST
    (newest / "meta.json").write_text((newest / "meta.json").read_text()[:-40])  # truncated
    kept = {p.name: p.read_bytes() for p in newest.iterdir()}
    again = _train(run_dir, "--epochs", "2", "--audit")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{_warning(newest)}meta.json is not valid JSON); trying the one before" in again.stderr
    assert f"resuming from {run_dir / 'checkpoints' / BEFORE}: epoch 0 step 20" in again.stdout
    # The new save at the same cursor moved the unreadable one aside, whole, instead of replacing it.
    aside = run_dir / "checkpoints" / f"damaged-{NEWEST}"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept
    assert "moved it to damaged-ckpt-00001-000000" in again.stderr
    audit = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run_dir)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert audit.returncode == 0, audit.stdout[-2000:]


def test_a_changed_byte_of_a_weight_is_caught_by_its_digest(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    newest = run_dir / "checkpoints" / NEWEST
    model = bytearray((newest / "model.safetensors").read_bytes())
    model[-100] ^= 0x40  # one bit of a float: safetensors loads it without a word
    (newest / "model.safetensors").write_bytes(bytes(model))
    again = _train(run_dir, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{_warning(newest)}model.safetensors does not match its digest" in again.stderr
    assert f"resuming from {run_dir / 'checkpoints' / BEFORE}" in again.stdout


def test_a_changed_byte_of_meta_json_is_caught_by_its_digest(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    newest = run_dir / "checkpoints" / NEWEST
    meta = json.loads((newest / "meta.json").read_text())
    meta["saved_at"] += 1.0  # valid JSON, another value
    (newest / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    again = _train(run_dir, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{_warning(newest)}meta.json does not match its digest" in again.stderr


def _truncate_data(ckpt: Path) -> None:
    data = next(ckpt.glob("state.data-*"))
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])


@pytest.mark.parametrize("written_as", ["digests", "format 2"])
def test_tf_a_truncated_state_data_falls_back_to_the_one_before(tmp_path, written_as):
    """Format 3 catches it by size; a format-2 checkpoint (no digests) by TensorFlow's reader, whatever it raises."""
    pytest.importorskip("tensorflow")
    tf_args = ["--framework", "tf", "--replicas", "1"]
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--epochs", "1", framework=tf_args).returncode == 0
    newest = run_dir / "checkpoints" / NEWEST
    if written_as == "format 2":
        meta = json.loads((newest / "meta.json").read_text())
        meta = {k: v for k, v in meta.items() if k not in ("files", "digest", "config")}
        (newest / "meta.json").write_text(json.dumps({**meta, "format": 2}))
    _truncate_data(newest)
    kept = {p.name: p.read_bytes() for p in newest.iterdir()}
    again = _train(run_dir, "--epochs", "1", framework=tf_args)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    why = ("state.data-00000-of-00001 is " if written_as == "digests"
           else f"ValueError: {newest}: the variables do not load")
    assert f"{_warning(newest)}{why}" in again.stderr and "trying the one before" in again.stderr
    assert f"resuming from {run_dir / 'checkpoints' / BEFORE}" in again.stdout
    # The epoch's end saved at the same cursor: the damaged one was moved aside, whole.
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints" / f"damaged-{NEWEST}").iterdir()} == kept


def test_a_changed_learning_rate_is_honoured_and_said(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    again = _train(run_dir, "--epochs", "2", "--learning-rate", "0.1")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "adam lr 0.1," in again.stdout
    assert f"resuming from {run_dir / 'checkpoints' / NEWEST}: epoch 1 step 0 (learning rate 0.1)" in again.stdout
    assert "learning rate 0.1 from --learning-rate (the checkpoint trained at 0.003)" in again.stdout
    meta = json.loads((run_dir / "checkpoints" / "ckpt-00002-000000" / "meta.json").read_text())
    assert meta["learning_rate"] == pytest.approx(0.1) and meta["config"]["learning_rate"] == 0.1
    same = _train(run_dir, "--epochs", "3", "--learning-rate", "0.1")  # not a change any more: nothing to say
    assert same.returncode == 0 and "from --learning-rate" not in same.stdout, same.stderr[-2000:]


def test_a_lowered_learning_rate_is_kept_and_the_banner_shows_it(tmp_path):
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    args = ("--optimizer", "sgd", "--learning-rate", "1000")  # diverges: one restore halves the rate
    first = _train(run_dir, "--epochs", "1", *args)
    assert first.returncode == 0 and "learning rate 1000 -> 500" in first.stderr, first.stderr[-2000:]
    again = _train(run_dir, "--epochs", "2", *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "sgd lr 500," in again.stdout and "(learning rate 500)" in again.stdout
    assert "from --learning-rate" not in again.stdout


@pytest.mark.parametrize("flag,value,was", [("--optimizer", "sgd", "adam"), ("--model", "cnn", "mlp"),
                                            ("--dropout", "0.5", "0")])
def test_a_flag_a_resume_cannot_honour_is_refused_naming_it(trained, tmp_path, flag, value, was):
    run_dir = _copy(trained, tmp_path)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    again = _train(run_dir, "--epochs", "2", "--audit", flag, value)
    err = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(err) == 1, again.stderr[-2000:]
    assert f"trained with {flag} {was}, this run has {flag} {value}" in err[0]
    assert f"resume with {flag} {was}, or --no-resume" in err[0]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_turning_the_audit_on_at_a_resume_says_what_the_trail_misses(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    again = _train(run_dir, "--epochs", "2", "--no-audit")
    assert again.returncode == 0, again.stderr[-2000:]
    assert ("no audit trail from epoch 1 step 0 on: the checkpoint's run had --audit and this one has not"
            in again.stdout)


def _gather_of(rows_by_worker):
    """A fake all-gather of 2 workers with one replica each: returns the rows every worker hands in."""
    return lambda mine: np.concatenate(rows_by_worker)


def test_agreement_gives_up_a_checkpoint_another_worker_cannot_restore():
    ok = np.array([[1.0, 0.0, 1.0]])
    failed = np.array([[1.0, 0.0, 0.0]])
    agree = agreement(_gather_of([ok, failed]))
    assert agree(Cursor(1, 0), None) == "worker 1 could not restore it"
    assert agree(Cursor(1, 0), "mine is bad") == "mine is bad"
    assert agreement(_gather_of([ok, ok]))(Cursor(1, 0), None) is None
    elsewhere = agreement(_gather_of([ok, np.array([[0.0, 20.0, 1.0]])]))
    with pytest.raises(ValueError, match=r"different checkpoints .* on worker 1\); .*share"):
        elsewhere(Cursor(1, 0), None)


@pytest.mark.parametrize("rebalance", ["auto", "off"])
def test_rebalance_off_at_a_resume_sets_the_checkpoints_measured_weights_aside_and_says_so(tmp_path, rebalance):
    """A checkpoint carries the replica weights measured so far; --rebalance off resumes on equal shares."""
    pytest.importorskip("tensorflow")
    tf_args = ["--framework", "tf", "--replicas", "2"]
    run_dir = tmp_path / "run"
    first = _train(run_dir, "--epochs", "1", "--rebalance", "off", framework=tf_args)
    assert first.returncode == 0, first.stderr[-2000:]
    meta_path = run_dir / "checkpoints" / NEWEST / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(seal({**meta, "weights": [1.0, 0.5]})))  # as a rebalanced run leaves it
    again = _train(run_dir, "--epochs", "2", "--rebalance", rebalance, framework=tf_args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / NEWEST}" in again.stdout
    set_aside = "--rebalance off: the checkpoint's measured replica weights 1, 0.5 are not used"
    kept = "resuming with the measured replica weights 1, 0.5"
    assert (set_aside in again.stdout) == (rebalance == "off") and (kept in again.stdout) == (rebalance == "auto")
    last = json.loads((run_dir / "checkpoints" / "ckpt-00002-000000" / "meta.json").read_text())
    assert (last.get("weights") is None) == (rebalance == "off"), last.get("weights")
