"""``Checkpointer`` and ``TrainingGuard`` refuse, when built, arguments that would fail at the first checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.run import Checkpointer, TrainingGuard
from tests.run._tiny_state import TinyState as _State

PLAN = ef.Plan(ef.Index(40), ef.Topology(1), global_batch_size=10)


def test_a_state_without_the_model_state_methods_is_named():
    class Half:
        def describe(self):
            return {}

    with pytest.raises(TypeError, match=r"state must be a ModelState .*got Half without is_finite, write, read"):
        Checkpointer("unused", Half())


def test_a_run_dir_that_is_a_file_is_refused_and_left_alone(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    with pytest.raises(ValueError, match=f"run_dir {afile} exists and is not a directory"):
        Checkpointer(afile, _State())
    assert afile.read_text() == "mine"


@pytest.mark.parametrize("args,error,message", [
    (("plan", None), TypeError, "plan must be an evenflow Plan, got str"),
    ((PLAN, "runs/x"), TypeError, r"checkpointer must be an evenflow.run.Checkpointer, got str"),
])
def test_the_guard_names_a_plan_or_checkpointer_of_the_wrong_kind(tmp_path, args, error, message):
    with pytest.raises(error, match=message):
        TrainingGuard(*args)


@pytest.mark.parametrize("every", [-1, 2.5, True])
def test_the_guard_refuses_an_interval_that_is_not_a_count_of_steps(tmp_path, every):
    with pytest.raises(ValueError, match=rf"every must be (at least 0|an integer), got .*{every!r}\)?; steps between"):
        TrainingGuard(PLAN, Checkpointer(tmp_path, _State()), every=every)


def test_a_guard_of_good_arguments_saves_and_resumes(tmp_path):
    guard = TrainingGuard(PLAN, Checkpointer(tmp_path, _State()), every=np.int64(2))  # numpy ints count too
    assert guard.every == 2 and type(guard.every) is int
    assert guard.resume() is None
    guard.checkpointer.save(ef.Cursor(0, 2))
    assert TrainingGuard(PLAN, Checkpointer(tmp_path, _State())).resume() == ef.Cursor(0, 2)
