"""A checkpointer with ``background=True`` (``evenflow.tf.fit``'s) makes each save durable in a thread.

The save writes the files and returns; the fsyncs, the rename to the checkpoint's name and the
pruning go on while training does. Until the rename the checkpoint does not exist; every other
method waits for it first, and what the thread raised is raised on the training thread, by the
next call or by ``wait()``.
"""
from __future__ import annotations

import threading

import pytest

from evenflow.plan.cursor import Cursor
from evenflow.run import checkpoints as checkpoints_module
from evenflow.run.checkpoints import Checkpointer, list_checkpoints
from tests.run._tiny_state import TinyState


def _names(run_dir) -> list[str]:
    return [info.path.name for info in list_checkpoints(run_dir)]


def test_a_save_returns_before_it_is_durable_and_exists_once_it_is(tmp_path, monkeypatch):
    go = threading.Event()
    fsync = checkpoints_module.fsync_file
    monkeypatch.setattr(checkpoints_module, "fsync_file", lambda path: (go.wait(10), fsync(path)))
    saver = Checkpointer(tmp_path, TinyState(), keep=2, background=True)
    final = saver.save(Cursor(1, 0), {"note": "epoch 0"})
    assert not final.exists() and _names(tmp_path) == []  # its files are written, not yet fsynced and renamed
    go.set()
    saver.wait()
    assert _names(tmp_path) == ["ckpt-00001-000000"] and (final / "state.txt").read_text() == "x"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_the_next_call_waits_for_the_save_confirm_and_prune_included(tmp_path):
    saver = Checkpointer(tmp_path, TinyState(), keep=2, background=True)
    for epoch in range(1, 5):
        saver.save(Cursor(epoch, 0))  # each save waits for the one before, which then pruned
    saver.confirm(Cursor(4, 0))  # waits: the newest is there to be confirmed
    assert _names(tmp_path) == ["ckpt-00003-000000", "ckpt-00004-000000"]
    assert [info.confirmed for info in list_checkpoints(tmp_path)] == [False, True]


def test_what_the_thread_raised_is_raised_by_the_next_call_and_the_checkpoint_is_not_there(tmp_path, monkeypatch):
    saver = Checkpointer(tmp_path, TinyState(), keep=2, background=True)
    saver.save(Cursor(1, 0))
    saver.wait()

    def full(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints_module, "fsync_file", full)
    saver.save(Cursor(2, 0))
    with pytest.raises(OSError, match="No space left"):
        saver.save(Cursor(3, 0))  # raised before this save starts: nothing is lost
    saver.wait()  # raised once
    assert _names(tmp_path) == ["ckpt-00001-000000"]  # the previous checkpoint as it was, no half of the failed one
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    monkeypatch.undo()
    saver.save(Cursor(2, 0))
    saver.wait()
    assert _names(tmp_path) == ["ckpt-00001-000000", "ckpt-00002-000000"]
