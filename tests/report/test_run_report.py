"""``evenflow report``: telemetry loading, the diagnosis rules, the HTML page and the CLI (no TensorFlow)."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.report.run_report import downsample, write_report
from evenflow.report.telemetry import diagnose, diagnose_phases, load_telemetry

R = 4


def _step(i, compute, step_seconds=None, input_wait=0.0, weights=None, **extra):
    compute = [float(c) for c in compute]
    step_seconds = max(compute) + input_wait + 0.1 if step_seconds is None else step_seconds
    return {"kind": "step", "epoch": 0, "step": i, "global_step": i, "weights": weights or [1.0] * len(compute),
            "samples": [8] * len(compute), "cost": [8.0] * len(compute), "compute": compute,
            "input_wait": input_wait, "step_seconds": step_seconds, **extra}


def _write(run_dir, lines, replicas=R, tail="", **run):
    run_dir.mkdir(parents=True, exist_ok=True)
    head = {"kind": "run", "replicas": replicas, "workers": 1, "global_batch_size": 8 * replicas,
            "steps_per_epoch": 100, "load_unit": "samples", **run}
    text = "\n".join(json.dumps(x) for x in [head, *lines]) + "\n" + tail
    (run_dir / "telemetry.jsonl").write_text(text)
    return run_dir


def _straggling(n, start=0):
    # replica 2 computes 2 s, the others 1 s; each step 2.2 s, so others wait 3 * 1 s per step for replica 2
    return [_step(start + i, [1, 1, 2, 1], step_seconds=2.2) for i in range(n)]


def _balanced(n, start=0, input_wait=0.0):
    rng = np.random.default_rng(0)
    return [_step(start + i, 1.0 + 0.01 * rng.random(R), step_seconds=1.0, input_wait=input_wait) for i in range(n)]


def test_balanced_run(tmp_path):
    d = diagnose(load_telemetry(_write(tmp_path / "run", _balanced(50))))
    assert d.kind == "balanced"
    assert d.straggler_fraction < 0.01 and d.imbalance < 1.01
    assert d.lines[0].startswith("balanced: input wait ") and d.lines[-1] == "nothing to fix"


def test_straggler_charged_with_hand_computed_wait(tmp_path):
    tel = load_telemetry(_write(tmp_path / "run", _straggling(10)))
    d = diagnose(tel)
    assert d.kind == "straggler" and d.straggler == 2
    assert d.straggler_wait_seconds == pytest.approx(10 * 3 * 1.0)  # 10 steps x 3 others x (2 s - 1 s)
    assert d.straggler_fraction == pytest.approx(30.0 / (3 * 22.0))
    assert d.imbalance == pytest.approx(2.0 / 1.25)
    assert d.waited_for == pytest.approx((0.0, 0.0, 30.0, 0.0))
    assert "replica 2 took 2.0x the others' compute time" in d.text
    assert "for replica 2 (30.0 s)" in d.text and "rebalancing is off" in d.text


@pytest.mark.parametrize("wait, kind", [
    (0.30, "input-bound"),             # 30% of step time waiting for input
    (0.08, "moderately input-bound"),  # 8%
    (0.02, "balanced"),                # 2%
])
def test_input_wait_rules(tmp_path, wait, kind):
    d = diagnose(load_telemetry(_write(tmp_path / "run", _balanced(20, input_wait=wait))))
    assert d.kind == kind and d.text.startswith(kind + ": ")
    assert d.input_wait_fraction == pytest.approx(wait)
    assert f"input wait {wait:.1%} of step time" in d.text
    assert ("evenflow convert" in d.text and "augmentation costs CPU" in d.text) == (kind != "balanced")


def test_input_bound_and_straggler_larger_problem_wins_and_both_are_said(tmp_path):
    # straggler fraction 30 / (3 * 22) = 45% beats 25% input wait
    steps = [_step(i, [1, 1, 2, 1], step_seconds=2.2, input_wait=0.55) for i in range(10)]
    d = diagnose(load_telemetry(_write(tmp_path / "run", steps)))
    assert d.kind == "straggler" and d.input_wait_fraction == pytest.approx(0.25)
    line = d.text
    assert line.startswith("straggler: the others waited 45.5% of their step time for replica 2 (30.0 s)")
    assert "input wait 25.0% of step time (5.50 s of 22.0 s over 10 steps)" in line
    assert line.index("rebalancing is off") < line.index("feed faster")  # the verdict's advice first


def test_rebalance_splits_run_into_before_and_after(tmp_path):
    event = {"kind": "rebalance", "epoch": 0, "step": 10, "global_step": 10, "before": [1.0] * R,
             "after": [1, 1, 0.5, 1], "speeds": [8, 8, 4, 8], "imbalance_before": 1.6, "imbalance_after": 1.0}
    tel = load_telemetry(_write(tmp_path / "run", [*_straggling(10), event, *_balanced(10, start=10)]))
    assert [ev["index"] for ev in tel.rebalances] == [10]
    phases = diagnose_phases(tel)
    assert phases["before rebalancing"].kind == "straggler" and phases["before rebalancing"].straggler == 2
    assert (phases["before rebalancing"].start, phases["before rebalancing"].stop) == (0, 10)
    assert phases["after rebalancing"].kind == "balanced" and phases["after rebalancing"].start == 10
    assert "changed the weights after these steps, at update 10" in phases["before rebalancing"].text
    assert "compare the diagnoses before and after" in phases["whole run"].text


def test_unknown_keys_and_kinds_ignored_truncated_last_line_skipped(tmp_path):
    lines = [_step(0, [1] * R, future_field=[1, 2]), {"kind": "checkpoint", "path": "x"}, _step(1, [1] * R)]
    tel = load_telemetry(_write(tmp_path / "run", lines, tail='{"kind": "step", "epoch": 0, "st'))
    assert tel.num_updates == 2 and tel.compute.shape == (2, R)
    assert tel.truncated_line == 5  # run line, 3 lines, then the cut one


def test_bad_json_in_the_middle_is_an_error(tmp_path):
    run_dir = _write(tmp_path / "run", [_step(0, [1] * R)])
    with open(run_dir / "telemetry.jsonl", "a") as f:
        f.write('{"kind": "st\n' + json.dumps(_step(1, [1] * R)) + "\n")
    with pytest.raises(ValueError, match=r"line 3 is not valid JSON"):
        load_telemetry(run_dir)


def test_wrong_array_length_names_the_line(tmp_path):
    run_dir = _write(tmp_path / "run", [_step(0, [1] * R), _step(1, [1] * (R - 1))])
    with pytest.raises(ValueError, match=r"telemetry\.jsonl line 3: 'weights' must have one value per replica "
                                         r"\(4, from the run line\), got 3 values"):
        load_telemetry(run_dir)


def test_missing_dir_file_and_steps(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_telemetry(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="written by evenflow train with telemetry; run training first"):
        load_telemetry(tmp_path / "empty")
    with pytest.raises(ValueError, match="has no step lines"):
        load_telemetry(_write(tmp_path / "nosteps", []))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "telemetry.jsonl").write_text("this is not json\n")
    with pytest.raises(ValueError, match="no run line: line 1, its last, is not a JSON object; this is not a "
                                         "telemetry file of evenflow train"):
        load_telemetry(garbage)


def test_downsample_averages_buckets():
    x = np.arange(1200.0)
    y = np.stack([x, 2 * x], axis=1)
    xb, yb = downsample(x, y, max_points=600)
    assert xb.shape == (600,) and yb.shape == (600, 2)
    assert xb[0] == 0.5 and yb[0].tolist() == [0.5, 1.0] and yb[-1].tolist() == [1198.5, 2397.0]


def test_html_report_is_self_contained(tmp_path):
    event = {"kind": "rebalance", "epoch": 0, "step": 10, "global_step": 10, "before": [1.0] * R,
             "after": [1, 1, 0.5, 1], "speeds": [8, 8, 4, 8], "imbalance_before": 1.6, "imbalance_after": 1.0}
    run_dir = _write(tmp_path / "run<x>", [*_straggling(10), event, *_balanced(1500, start=10)])
    (run_dir / "summary.json").write_text(json.dumps({"test_accuracy": 0.97, "dataset": "digits <&>"}))
    path, d = write_report(run_dir)
    assert path == run_dir / "report.html" and d.kind in ("balanced", "straggler")
    page = path.read_text()
    assert page.count("<svg") == 4 and page.count("</svg>") == 4
    assert not re.search(r"<script|<link|@import|https?:", page)
    assert "digits &lt;&amp;&gt;" in page and "digits <&>" not in page and "run&lt;x&gt;" in page
    assert page.count('class="rebalance"') == 4  # one marker per chart
    assert "before rebalancing" in page and "after rebalancing" in page
    n_points = max(len(m.split()) for m in re.findall(r'points="([^"]*)"', page))
    assert n_points <= 600
    assert not list(run_dir.glob(".report.html.tmp-*"))


def test_cli_prints_table_diagnosis_and_writes(tmp_path, capsys):
    run_dir = _write(tmp_path / "run", _straggling(10))
    out_file = tmp_path / "page.html"
    assert main(["report", str(run_dir), "--output", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert out_file.is_file() and f"wrote {out_file}" in out
    assert "whole run (updates 0..9): straggler" in out and "replica 2 took 2.0x" in out
    assert re.search(r"^\s*2\s+80\s+20\.00\s", out, re.M)  # replica 2: 80 samples, 20 s compute
    assert "cost" not in out.splitlines()[0]  # a run without costs: no cost column repeating the samples


def test_the_cost_column_is_there_exactly_when_the_run_had_costs(tmp_path, capsys):
    costly = [{**s, "cost": [12.5] * R} for s in _straggling(10)]
    for unit, lines in (("cost", costly), ("samples", _straggling(10))):
        run_dir = _write(tmp_path / unit, lines, load_unit=unit)
        assert main(["report", str(run_dir)]) == 0
        header = capsys.readouterr().out.splitlines()[0].split()
        page = (run_dir / "report.html").read_text()
        assert ("cost" in header) == ("<th>cost</th>" in page) == (unit == "cost"), (unit, header)
        if unit == "cost":
            assert re.search(r"<tr><td>2</td><td>80</td><td>125</td><td>20</td>", page)  # 10 steps x 12.5


def test_cli_diagnoses_the_run_once_for_the_table_and_the_page(tmp_path, capsys, monkeypatch):
    import evenflow.report.run_report as run_report
    import evenflow.report.telemetry as telemetry

    calls = []

    def counted(tel):
        calls.append(tel)
        return diagnose_phases(tel)

    monkeypatch.setattr(telemetry, "diagnose_phases", counted)
    monkeypatch.setattr(run_report, "diagnose_phases", counted)
    assert main(["report", str(_write(tmp_path / "run", _straggling(10)))]) == 0
    assert len(calls) == 1 and "straggler" in capsys.readouterr().out


def test_cli_without_telemetry_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["report", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evenflow report: error: ") and "run training first" in err and "\n" not in err
    assert not (tmp_path / "run" / "report.html").exists()


def test_cli_output_that_is_a_folder_exits_2_naming_it(tmp_path, capsys):
    run_dir = _write(tmp_path / "run", _straggling(10))
    assert main(["report", str(run_dir), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--output {tmp_path} is a folder" in err and "report.html" in err and "\n" not in err
    assert not list(tmp_path.glob(".*.tmp-*")) and not (run_dir / "report.html").exists()


def test_a_rebalance_that_was_undone_is_named_as_such(tmp_path):
    weights = [1.0, 1.0, 0.5, 1.0]
    replan = {"kind": "rebalance", "epoch": 0, "step": 4, "global_step": 4, "before": [1.0] * R, "after": weights,
              "reason": "replan"}
    undo = {"kind": "rebalance", "epoch": 0, "step": 8, "global_step": 8, "before": weights, "after": [1.0] * R,
            "reason": "undo"}
    lines = _straggling(4) + [replan] + _straggling(4, start=4) + [undo] + _straggling(4, start=8)
    d = diagnose(load_telemetry(_write(tmp_path / "run", lines)))
    assert d.kind == "straggler" and d.straggler == 2
    assert "steps got no faster, so it went back at update 8" in d.text, d.lines


# -- the one diagnosis line: its verdict agrees with the figures it prints ---------------------------------------

_LINE = re.compile(r"^(?P<kind>[a-z -]+): .*input wait (?P<iwf>[\d.]+)% of step time \((?P<wait>[\d.,]+) s of ", re.S)
_STRAG = re.compile(r"the others waited (?P<sf>[\d.]+)% of their step time for replica \d+ \((?P<s>[\d.,]+) s\)")


def _verdict_of_printed_figures(line: str) -> str:
    """The verdict the rules give for the percentages the line prints (thresholds 20%, 10%, 5%)."""
    m, s = _LINE.match(line), _STRAG.search(line)
    assert m, line
    iwf, sf = float(m["iwf"]), float(s["sf"]) if s else 0.0
    if float(m["iwf"]) > 0:
        assert float(m["wait"].replace(",", "")) > 0, line  # a wait that counted is never shown as 0 s
    if iwf >= 20 and sf >= 10:
        return "input-bound" if iwf >= sf else "straggler"
    return "input-bound" if iwf >= 20 else "straggler" if sf >= 10 else \
        "moderately input-bound" if iwf >= 5 else "balanced"


def _input_steps(fraction, n=40):
    # equal compute: nobody waits for a replica; input wait is `fraction` of each 1 s step
    return [_step(i, [0.5] * R, step_seconds=1.0, input_wait=fraction) for i in range(n)]


def _straggler_steps(fraction, n=40, r=2):
    # 2 replicas, replica 1 computes 2 * fraction s longer in 2 s steps: the other waits `fraction` of its step time
    return [_step(i, [0.5, 0.5 + 2 * fraction], step_seconds=2.0) for i in range(n)]


@pytest.mark.parametrize("fraction, kind, shown", [
    (0.0494, "balanced", "4.9%"),
    (0.0496, "moderately input-bound", "5.0%"),   # rounds to the threshold as printed: the verdict follows the print
    (0.1994, "moderately input-bound", "19.9%"),
    (0.1996, "input-bound", "20.0%"),
    (0.0021, "balanced", "0.2%"),
])
def test_input_verdict_boundaries(tmp_path, fraction, kind, shown):
    d = diagnose(load_telemetry(_write(tmp_path / "run", _input_steps(fraction))))
    line = d.text
    assert d.kind == kind and line.startswith(f"{kind}: input wait {shown} of step time")
    assert _verdict_of_printed_figures(line) == kind
    assert " 0.0 s" not in line and "0.00 s" not in line


@pytest.mark.parametrize("fraction, kind, shown", [
    (0.0994, "balanced", "9.9%"),
    (0.0996, "straggler", "10.0%"),
    (0.30, "straggler", "30.0%"),
])
def test_straggler_verdict_boundaries(tmp_path, fraction, kind, shown):
    d = diagnose(load_telemetry(_write(tmp_path / "run", _straggler_steps(fraction), replicas=2)))
    line = d.text
    assert d.kind == kind and f"the others waited {shown} of their step time for replica 1" in line
    assert _verdict_of_printed_figures(line) == kind
    assert ("rebalancing is off" in line) == (kind == "straggler") and ("nothing to fix" in line) == (kind != "straggler")


def test_both_over_their_thresholds_the_larger_decides_and_the_line_agrees(tmp_path):
    # input wait 0.42 of 2 s = 21%; the other replica waits 0.5 s per step = 25%: straggler wins
    steps = [_step(i, [0.5, 1.0], step_seconds=2.0, input_wait=0.42) for i in range(20)]
    d = diagnose(load_telemetry(_write(tmp_path / "run", steps, replicas=2)))
    line = d.text
    assert d.kind == "straggler" == _verdict_of_printed_figures(line)
    assert "25.0% of their step time" in line and "input wait 21.0%" in line and "feed faster" in line


def test_the_help_states_the_thresholds_the_code_uses():
    from evenflow.commands.report import EPILOG
    from evenflow.report import telemetry as t
    text = " ".join(EPILOG.split())
    assert f"input-bound when the steps waited >= {t.INPUT_BOUND:.0%}" in text
    assert f">= {t.STRAGGLER:.0%} of their step time" in text and f"from {t.INPUT_MODERATE:.0%} input wait" in text


def test_a_straggler_kept_because_a_re_plan_would_not_repay_its_cost_says_so(tmp_path):
    # Rebalancing was on and predicted faster steps, but not enough to repay a re-plan over the
    # steps left: the line gives the gain, the saving, the cost it was weighed against and the fix.
    held = {"kind": "held", "epoch": 0, "step": 5, "global_step": 5, "gain": 1.42, "saving_seconds": 0.8,
            "replan_seconds": 1.27, "payback": 1.5, "replans": 0}
    lines = _straggling(6) + [held] + _straggling(4, start=6) + [{**held, "gain": 1.38, "saving_seconds": 0.5}]
    d = diagnose(load_telemetry(_write(tmp_path / "run", lines)))
    assert d.kind == "straggler" and d.straggler == 2
    line = d.text
    assert "rebalancing is on but kept the split: 2 checks predicted faster steps" in line, line
    assert "(the best after 6 updates: 1.42x, 0.800 s saved over the steps left)" in line  # the larger saving
    assert "less than 1.5x a re-plan's cost (1.27 s, estimated from the pipelines' first opening)" in line
    assert "--rebalance-payback" in line and max(len(x) for x in d.lines) <= 160
    # A check judges the updates before it: the first one (after 6 updates) explains updates 0..5, not 0..4.
    tel = load_telemetry(tmp_path / "run")
    assert "kept the split: 1 check predicted" in diagnose(tel, 0, 6).text
    assert "kept the split" not in diagnose(tel, 0, 5).text


def test_output_must_be_an_html_file_so_no_run_file_or_device_is_replaced(tmp_path, capsys):
    run_dir = _write(tmp_path / "run", _straggling(10))
    telemetry = (run_dir / "telemetry.jsonl").read_bytes()
    for target in (run_dir / "telemetry.jsonl", run_dir / "summary.json", tmp_path / "notes.txt"):
        assert main(["report", str(run_dir), "--output", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"--output {target} is not an .html file" in err and "\n" not in err
    assert (run_dir / "telemetry.jsonl").read_bytes() == telemetry and not (tmp_path / "notes.txt").exists()
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    assert main(["report", str(run_dir), "--output", str(fifo)]) == 2
    assert "is not an .html file" in capsys.readouterr().err


def test_an_unwritable_output_names_the_report_not_a_temporary_file(tmp_path, capsys):
    # /proc takes no new files, whoever runs the test (root included)
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    run_dir = _write(tmp_path / "run", _straggling(10))
    assert main(["report", str(run_dir), "--output", "/proc/evenflow-report.html"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write the report to /proc/evenflow-report.html" in err and ".tmp-" not in err and "\n" not in err


def test_a_file_given_as_the_run_directory_is_named_as_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="afile is a file, not a folder"):
        load_telemetry(tmp_path / "afile")


@pytest.mark.parametrize("field, value, rule", [
    ("compute", [float("nan"), 1, 1, 1], "a finite number >= 0"), ("step_seconds", -5, "a finite number >= 0"),
    ("epoch", 1.9, "a whole number >= 0"), ("epoch", True, "a whole number >= 0"),
    ("samples", [8, 8, float("inf"), 8], "a whole number >= 0"), ("input_wait", "0.1", "a finite number >= 0")])
def test_a_step_field_that_is_not_a_finite_non_negative_number_names_the_line(tmp_path, field, value, rule):
    lines = _straggling(5)
    lines[3][field] = value
    run_dir = _write(tmp_path / "run", lines)
    with pytest.raises(ValueError, match=rf"telemetry\.jsonl line 5: '{field}' must be {rule}"):
        load_telemetry(run_dir)


def test_a_resume_on_another_replica_count_reports_the_run_since(tmp_path, capsys):
    two = {"kind": "run", "replicas": 2, "workers": 1, "global_batch_size": 16, "steps_per_epoch": 100,
           "load_unit": "samples"}
    run_dir = _write(tmp_path / "run", [*_straggling(10), two, *[_step(10 + i, [1, 2]) for i in range(6)]])
    tel = load_telemetry(run_dir)
    assert tel.replicas == 2 and tel.num_updates == 6 and tel.earlier_updates == 10
    assert main(["report", str(run_dir)]) == 0
    assert "resumed on 2 replicas after 10 updates" in capsys.readouterr().out


def test_a_damaged_summary_is_named_not_ignored(tmp_path, capsys):
    run_dir = _write(tmp_path / "run", _straggling(10))
    (run_dir / "summary.json").write_text("{bad")
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"note: {run_dir / 'summary.json'} cannot be read" in out


def test_the_command_reads_the_summary_once_for_the_page_and_its_notes(tmp_path, capsys, monkeypatch):
    from evenflow.report import run_report

    run_dir = _write(tmp_path / "run", _straggling(10))
    (run_dir / "summary.json").write_text(json.dumps({"dataset": "shapes-7f3a: 160 samples"}))
    reads = []
    real = run_report.read_summary
    monkeypatch.setattr(run_report, "read_summary", lambda d: reads.append(d) or real(d))
    assert main(["report", str(run_dir)]) == 0
    assert len(reads) == 1 and "note:" not in capsys.readouterr().out
    assert "shapes-7f3a: 160 samples" in (run_dir / "report.html").read_text()


# -- logical devices sharing one CPU's cores: their times say nothing about balance ---------------------------------

def test_on_shared_cores_the_verdict_is_not_measurable_in_two_short_lines(tmp_path, capsys):
    # replica 2 "takes 2x" — on logical devices sharing cores that is scheduling, not a slow device
    run_dir = _write(tmp_path / "run", _straggling(10), shared_devices=True)
    d = diagnose(load_telemetry(run_dir))
    assert d.kind == "not measurable here" and d.shared
    assert d.lines == ("not measurable here: the replicas share cores",
                       "the 4 replicas are logical devices on one CPU's cores: whichever runs last looks slow; "
                       "input wait 0.0% of step time")
    assert all(len(x) <= 160 for x in d.lines) and "straggler" not in d.text and "[" not in d.text
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "whole run (updates 0..9): not measurable here: the replicas share cores\n  the 4 replicas" in out
    page = (run_dir / "report.html").read_text()  # the page's badge says what the terminal says
    assert '<span class="kind not-measurable-here">not measurable here</span>' in page
    assert 'class="kind straggler"' not in page and "mean imbalance over the run" not in page
    assert "not a measure of balance here" in page


def test_on_shared_cores_an_input_bound_run_is_still_input_bound(tmp_path):
    steps = [_step(i, [1, 1, 2, 1], step_seconds=2.2, input_wait=0.66) for i in range(10)]
    d = diagnose(load_telemetry(_write(tmp_path / "run", steps, shared_devices=True)))
    assert d.kind == "input-bound" and d.lines[0] == "input-bound: input wait 30.0% of step time (6.60 s of 22.0 s over 10 steps)"
    assert "balance is not measurable here" in d.lines[1] and d.lines[2].startswith("feed faster")
    assert "rebalancing" not in d.text


def test_separate_devices_keep_the_straggler_verdict_in_short_lines(tmp_path):
    d = diagnose(load_telemetry(_write(tmp_path / "run", _straggling(10), shared_devices=False)))
    assert d.kind == "straggler" and d.lines == (
        "straggler: the others waited 45.5% of their step time for replica 2 (30.0 s)",
        "replica 2 took 2.0x the others' compute time",
        "input wait 0.0% of step time (0.00 s of 22.0 s over 10 steps)",
        "rebalancing is off: turn it on so the plan gives replica 2 a smaller share, or give it a smaller weight")
