"""telemetry.jsonl is readable while a run goes on: lines reach the file within a second."""
from __future__ import annotations

import json

import numpy as np

from evenflow.run import monitor as monitor_module
from evenflow.run.monitor import FLUSH_SECONDS, ReplicaMonitor


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _update(m: ReplicaMonitor, step: int) -> None:
    t = float(step)
    m.record(0, step, {"sums": np.array([[0.0, 0.0, 4.0], [0.0, 0.0, 4.0]]),
                       "timing": np.array([[t, t, t, t + 0.5, t + 0.6]] * 2)})


def _steps_on_disk(path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if json.loads(x)["kind"] == "step"]


def test_step_lines_reach_the_file_once_a_second_has_passed_and_all_of_them_on_close(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(monitor_module.time, "monotonic", clock)
    path = tmp_path / "telemetry.jsonl"
    m = ReplicaMonitor(2, 8, 10, check_every=1, telemetry=path)
    _update(m, 0)
    m.absorb(m.window())
    assert _steps_on_disk(path) == []                  # within the second: still buffered
    clock.now += FLUSH_SECONDS
    _update(m, 1)
    m.absorb(m.window())
    assert _steps_on_disk(path) == [0, 1]              # a second later: everything written so far
    _update(m, 2)
    m.absorb(m.window())
    assert _steps_on_disk(path) == [0, 1]
    m.close()
    assert _steps_on_disk(path) == [0, 1, 2]


def test_a_check_held_back_by_payback_is_written_and_read_back(tmp_path):
    # The rebalancer predicted a gain that would not repay a re-plan over the steps left: the run
    # writes a "held" line, and the reader keeps it with the number of step lines before it.
    from evenflow.plan.speed.rebalancer import Decision
    from evenflow.report.telemetry import load_telemetry

    m = ReplicaMonitor(2, 8, 10, check_every=1, telemetry=tmp_path / "telemetry.jsonl")
    m.stream_opened(1.25)  # the first opening of the pipelines: what a re-plan is taken to cost
    held = Decision(None, (2.0, 1.0), 1.3, 1.5, 1.0, "payback", saving=0.4)
    m.rebalancer.check = lambda *a, **k: held
    got = []
    for step in range(3):
        _update(m, step)
        got.append(m.absorb(m.window()))
    m.close()
    assert got == [None, held, held]  # the first update is a warm-up: no check
    tel = load_telemetry(tmp_path)
    assert [ev["index"] for ev in tel.held] == [2, 3]
    ev = tel.held[0]
    assert (ev["gain"], ev["saving_seconds"], ev["replan_seconds"], ev["payback"], ev["replans"]) == \
        (1.3, 0.4, 1.25, m.rebalancer.options.payback, 0)


def test_a_resume_cuts_a_line_a_crash_left_half_written_and_marks_its_start(tmp_path):
    # The first run crashed mid-write; the resume must not glue its first line to the partial one.
    from evenflow.report.telemetry import load_telemetry

    path = tmp_path / "telemetry.jsonl"
    m = ReplicaMonitor(2, 8, 10, check_every=1, telemetry=path)
    for step in range(3):
        _update(m, step)
        m.absorb(m.window())
    m.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-40])  # the last step line loses its end
    m = ReplicaMonitor(2, 8, 10, check_every=1, telemetry=path, append=True)
    for step in range(2, 4):
        _update(m, step)
        m.absorb(m.window())
    m.close()
    kinds = [json.loads(x)["kind"] for x in path.read_text().splitlines()]  # every line is whole JSON
    assert kinds == ["run", "step", "step", "run", "step", "step"]
    tel = load_telemetry(tmp_path)
    assert tel.step.tolist() == [0, 1, 2, 3] and tel.truncated_line is None and tel.earlier_updates == 0


def test_drop_partial_line_keeps_whole_lines_only(tmp_path):
    from evenflow.util.files import drop_partial_line

    cases = {b"": b"", b"a\nb\n": b"a\nb\n", b"a\nb": b"a\n", b"partial": b"", b"a\n" + b"x" * 70000: b"a\n"}
    for before, after in cases.items():
        path = tmp_path / "f.jsonl"
        path.write_bytes(before)
        drop_partial_line(path)
        assert path.read_bytes() == after


def test_with_rebalancing_off_the_lines_are_the_same_and_only_the_speed_estimate_is_fed(tmp_path):
    # Rebalancing off: no decision can come of the rebalancer's step models, so they are not fed (the
    # per-update fits cost the training thread milliseconds per check); telemetry.jsonl is the same, and
    # summary.json's speeds still come from the moving average of each check's window, taken in when asked for.
    from evenflow.plan.speed.rebalancer import RebalanceOptions

    lines, monitors = {}, {}
    for enabled in (True, False):
        path = tmp_path / f"{enabled}.jsonl"
        m = ReplicaMonitor(2, 8, 10, check_every=2, telemetry=path, rebalance=RebalanceOptions(enabled=enabled))
        for step in range(8):
            _update(m, step)
            if m.due(step == 7):
                decision = m.absorb(m.window(), end_of_epoch=step == 7)
                assert decision is None or decision.weights is None  # equal replicas: no new weights
        m.close()
        lines[enabled] = [{k: v for k, v in json.loads(x).items() if k not in ("rebalance", "crc")}
                          for x in path.read_text().splitlines()]
        monitors[enabled] = m
    assert lines[False] == lines[True] and len(lines[True]) == 1 + 8
    assert len(monitors[True].rebalancer.model) > 0 and len(monitors[False].rebalancer.model) == 0
    assert not monitors[False].rebalancer.estimator.ready  # fed when summary() asks, not at every check
    assert monitors[False].summary()["speeds"] == monitors[True].summary()["speeds"] == [8.0, 8.0]
