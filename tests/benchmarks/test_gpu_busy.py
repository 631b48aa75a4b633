"""Smoke test of benchmarks/gpu_busy.py on the CPU: one child process runs the three loops and the JSON holds
their figures (no GPU here, so no busy share). Timings never gate a test."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.benchmarks import load  # noqa: E402


def test_gpu_busy_runs_every_loop_on_the_cpu_and_writes_their_figures(tmp_path):
    bench = load("gpu_busy")
    out = tmp_path / "gpu.json"
    bench.main(bench.parse_args(["--device", "cpu", "--workloads", "arrays", "--models", "cnn", "--samples", "256",
                                 "--global-batch-size", "64", "--epochs", "2", "--rounds", "1",
                                 "--array-workers", "0", "--json-out", str(out)]))
    result = json.loads(out.read_text())
    assert result["errors"] == {} and result["cli"] == []
    calls = result["runs"]["arrays/cnn"]
    assert sorted(calls) == ["ddp", "evenflow", "plain"]
    for rows in calls.values():
        assert len(rows) == 1 and rows[0]["samples_per_s"] > 0 and rows[0]["busy"] is None


def test_gpu_busy_refuses_unknown_workloads_and_too_few_epochs(capsys):
    bench = load("gpu_busy")
    for argv, words in ((["--workloads", "arrays,video"], "--workloads takes jpeg, arrays, got video"),
                        (["--epochs", "1"], "--epochs must be at least 2")):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(argv)
        assert e.value.code == 2 and words in capsys.readouterr().err
