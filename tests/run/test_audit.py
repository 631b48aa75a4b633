"""The audit trail and checkpoint listing without TensorFlow: segments, trimming, the check, the CLI, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main
from evenflow.run.audit import AuditLog, check_audit
from evenflow.run.checkpoints import list_checkpoints
from evenflow.run.options import AnomalyOptions, CheckpointOptions

N, G = 10, 4  # 3 steps per epoch: 4 + 4 + 2 samples


def _record(log: AuditLog, plan: ef.Plan, epoch: int, steps, skipped=()) -> None:
    ep = plan.epoch(epoch)
    for s in steps:
        log.record(epoch, s, np.arange(ep.replicas), ep.ids[s], s in skipped)


def _trail(tmp_path, replicas=2, epochs=2) -> tuple[AuditLog, ef.Plan]:
    plan = ef.Plan(ef.Index(N), ef.Topology(replicas), global_batch_size=G, seed=1)
    log = AuditLog(tmp_path, N, plan.num_steps, replicas)
    for e in range(epochs):
        _record(log, plan, e, range(plan.num_steps))
        log.flush()
    return log, plan


def test_a_whole_trail_is_exactly_once(tmp_path):
    _trail(tmp_path)
    report = check_audit(tmp_path)
    assert [(e.epoch, e.clean, e.samples, e.replica_counts) for e in report] == [(0, True, N, [2]), (1, True, N, [2])]
    assert not any(p.name.startswith(".") for p in (tmp_path / "audit").iterdir())  # no temporary files left


def test_a_step_recorded_twice_shows_its_duplicates(tmp_path):
    log, plan = _trail(tmp_path, epochs=1)
    _record(log, plan, 0, [1])  # step 1 trained again, as a lost-then-redone step would be without trimming
    log.flush()
    (e,) = check_audit(tmp_path)
    assert not e.clean and e.bad_steps == [1]
    assert e.duplicates == sorted(plan.epoch(0).step_ids(1).tolist())


def test_a_missing_step_is_an_incomplete_epoch(tmp_path):
    plan = ef.Plan(ef.Index(N), ef.Topology(2), global_batch_size=G, seed=1)
    log = AuditLog(tmp_path, N, plan.num_steps, 2)
    _record(log, plan, 0, [0, 2])
    log.flush()
    (e,) = check_audit(tmp_path)
    assert not e.complete and not e.clean and e.steps_recorded == 2 and e.duplicates == []


def test_trim_removes_everything_from_the_cursor_on(tmp_path):
    plan = ef.Plan(ef.Index(N), ef.Topology(2), global_batch_size=G, seed=1)
    log = AuditLog(tmp_path, N, plan.num_steps, 2)
    _record(log, plan, 0, range(3))
    _record(log, plan, 1, range(3))
    log.flush()  # one segment per epoch: e0 steps 0-2, e1 steps 0-2
    assert log.trim(ef.Cursor(1, 1)) == 2  # epoch 1's segment straddles the cursor: steps 1, 2 go
    report = check_audit(tmp_path)
    assert report[0].clean and report[1].steps_recorded == 1
    _record(log, plan, 1, [1, 2])  # the resumed process trains them again
    log.flush()
    assert all(e.clean for e in check_audit(tmp_path))
    assert log.trim(ef.Cursor(0, 0)) == 6 and not list((tmp_path / "audit").glob("*.npz"))


def test_an_elastic_epoch_mixes_replica_counts(tmp_path):
    plan2 = ef.Plan(ef.Index(N), ef.Topology(2), global_batch_size=G, seed=1)
    plan3 = plan2.with_topology(ef.Topology(3))
    log2 = AuditLog(tmp_path, N, plan2.num_steps, 2)
    _record(log2, plan2, 0, [0])
    log2.flush()
    rest = plan3.epoch(0, start=ef.Cursor(0, 1))
    log3 = AuditLog(tmp_path, N, plan3.num_steps, 3)
    for i in range(rest.num_steps):
        log3.record(0, 1 + i, np.arange(3), rest.ids[i], False)
    log3.flush()
    (e,) = check_audit(tmp_path)
    assert e.clean and e.replica_counts == [2, 3]


def test_skipped_steps_are_reported_not_failed(tmp_path):
    plan = ef.Plan(ef.Index(N), ef.Topology(2), global_batch_size=G, seed=1)
    log = AuditLog(tmp_path, N, plan.num_steps, 2)
    _record(log, plan, 0, range(3), skipped={1})
    log.flush()
    (e,) = check_audit(tmp_path)
    assert e.clean and e.skipped_steps == [1] and e.skipped_ids == sorted(plan.epoch(0).step_ids(1).tolist())


def test_audit_command_exit_codes_and_json(tmp_path, capsys):
    log, plan = _trail(tmp_path)
    assert main(["audit", str(tmp_path)]) == 0
    assert "every sample exactly once" in capsys.readouterr().out
    _record(log, plan, 1, [0])
    log.flush()
    assert main(["audit", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert "NOT clean" in text and "duplicated ids" in text
    assert main(["audit", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] is False and report["epochs"][1]["num_duplicates"] == len(plan.epoch(1).step_ids(0))


def test_audit_command_without_a_trail_is_one_line_exit_2(tmp_path, capsys):
    assert main(["audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evenflow audit: error: ") and "train with --audit" in err and len(err.splitlines()) == 1


def test_list_checkpoints_sees_only_whole_ones(tmp_path):
    root = tmp_path / "checkpoints"

    def make(name, meta, index=True):
        d = root / name
        d.mkdir(parents=True)
        if meta is not None:
            (d / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        if index:
            (d / "state.index").write_bytes(b"")

    make("ckpt-00000-000004", {"format": 2, "cursor": {"epoch": 0, "step": 4}})
    make("ckpt-00001-000000", {"format": 2, "cursor": {"epoch": 1, "step": 0}})
    make(".tmp-ckpt-00001-000002-123", {"format": 2, "cursor": {"epoch": 1, "step": 2}})  # a crashed save
    make("ckpt-00001-000004", "{truncated")                                                  # unreadable meta
    make("ckpt-00001-000006", {"format": 1, "cursor": {"epoch": 1, "step": 6}})  # another format
    assert [c.cursor for c in list_checkpoints(tmp_path)] == [ef.Cursor(0, 4), ef.Cursor(1, 0)]
    assert list_checkpoints(tmp_path / "nothing") == []


@pytest.mark.parametrize("cls,kwargs,fragment", [
    (CheckpointOptions, {"keep_checkpoints": 0}, "keep_checkpoints must be at least 1"),
    (CheckpointOptions, {"checkpoint_every": -1}, "checkpoint_every must be at least 0"),
    (CheckpointOptions, {"audit": "yes"}, "audit must be true or false"),
    (AnomalyOptions, {"restore_lr_factor": 2.0}, "restore_lr_factor must be in (0, 1]"),
    (AnomalyOptions, {"restore_lr_factor": 0.0}, "restore_lr_factor must be in (0, 1], got 0"),
    (AnomalyOptions, {"restore_after": 1.5}, "restore_after must be an integer"),
])
def test_bad_options(cls, kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=None) as info:
        cls(**kwargs)
    assert fragment in str(info.value)


def test_a_run_directory_of_another_plan_is_refused_before_training(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(50, 3)).astype(np.float32), y=np.arange(50) % 2)
    ckpt = tmp_path / "run" / "checkpoints" / "ckpt-00001-000000"
    ckpt.mkdir(parents=True)
    (ckpt / "state.index").write_bytes(b"")
    (ckpt / "meta.json").write_text(json.dumps({"format": 2, "cursor": {"epoch": 1, "step": 0}, "plan": "other"}))
    code = main(["train", "--dataset", str(tmp_path / "d.npz"), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "holds checkpoints of another plan" in err and "--no-resume" in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints"]  # nothing written


def test_no_resume_deletes_only_what_evenflow_wrote(tmp_path, capsys):
    from evenflow.run.job import start_over

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(50, 3)).astype(np.float32), y=np.arange(50) % 2)
    run = tmp_path / "run"
    (run / "checkpoints" / "ckpt-00001-000000").mkdir(parents=True)
    (run / "checkpoints" / "my-notes.txt").write_text("keep me")
    code = main(["train", "--dataset", str(tmp_path / "d.npz"), "--no-resume", "--output-dir", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "'my-notes.txt', which evenflow did not write" in err
    assert (run / "checkpoints" / "my-notes.txt").read_text() == "keep me"
    assert (run / "checkpoints" / "ckpt-00001-000000").is_dir()  # nothing deleted
    (run / "checkpoints" / "my-notes.txt").unlink()
    (run / "audit").mkdir()
    (run / "audit" / "e00000-s000000-000003-w000.npz").write_bytes(b"")
    start_over(run)
    assert list((run / "checkpoints").iterdir()) == [] and list((run / "audit").iterdir()) == []
