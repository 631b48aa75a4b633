"""A stopped run's last words: a rerun resumes from the newest whole checkpoint on disk, or starts over."""
from __future__ import annotations

import evenflow as ef
from evenflow.run import Checkpointer
from evenflow.run.rerun import rerun_advice
from tests.run._tiny_state import TinyState as _State


def test_without_a_checkpoint_the_rerun_starts_over(tmp_path):
    assert rerun_advice(None) == "run the same command again to start over"
    assert rerun_advice(tmp_path / "never-made") == "run the same command again to start over"
    (tmp_path / "checkpoints" / ".tmp-ckpt-00000-000002-1").mkdir(parents=True)  # a save cut short
    assert rerun_advice(tmp_path) == "run the same command again to start over"


def test_with_checkpoints_the_rerun_resumes_from_the_newest_whole_one(tmp_path):
    ckpt = Checkpointer(tmp_path, _State(), keep=5)
    ckpt.save(ef.Cursor(0, 2))
    newest = ckpt.save(ef.Cursor(1, 4))
    (tmp_path / "checkpoints" / ".tmp-ckpt-00001-000006-1").mkdir()  # a save cut short
    (tmp_path / "checkpoints" / "ckpt-00001-000008").mkdir()  # no meta.json: not one to resume from
    assert rerun_advice(tmp_path) == f"run the same command again to resume from {newest} (epoch 1 step 4)"
    assert rerun_advice(tmp_path, "rerun the same command on every worker") == (
        f"rerun the same command on every worker to resume from {newest} (epoch 1 step 4)")


def test_a_checkpoint_whose_files_do_not_match_their_digests_is_passed_over_as_the_resume_does(tmp_path):
    ckpt = Checkpointer(tmp_path, _State(), keep=5)
    older = ckpt.save(ef.Cursor(0, 2))
    newest = ckpt.save(ef.Cursor(1, 4))
    (newest / "state.txt").write_text("y")  # same size, another byte: its digest no longer matches
    assert rerun_advice(tmp_path) == f"run the same command again to resume from {older} (epoch 0 step 2)"
    (older / "state.txt").unlink()
    assert rerun_advice(tmp_path) == "run the same command again to start over"
