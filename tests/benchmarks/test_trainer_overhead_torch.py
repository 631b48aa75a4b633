"""Smoke test of benchmarks/trainer_overhead_torch.py: two pinned gloo ranks on tiny sizes write the documented JSON.

Timings never gate a test; only the shape of the output is checked.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.benchmarks import load  # noqa: E402


def test_trainer_overhead_torch_times_both_ratios_and_every_component(tmp_path):
    bench = load("trainer_overhead_torch")
    out = tmp_path / "overhead.json"
    args = bench.parse_args(["--samples", "256", "--global-batch-size", "32", "--steps", "3", "--repeats", "2",
                             "--breakdown", "--json-out", str(out)])
    bench.main(args)
    result = json.loads(out.read_text())
    assert result["num_samples"] == 256 and result["machine"]["ranks"] == 2
    for key, methods in (("step", bench.STEP_METHODS), ("loop", bench.LOOP_METHODS), ("parts", bench.PARTS)):
        summary = result[key]
        assert list(summary["seconds"]) == list(methods)
        assert all(len(runs) == 2 and min(runs) > 0 for runs in summary["seconds"].values())
        assert len(summary["ratio_per_round"]) == 2
        low, high = summary["ratio_spread"]
        assert 0 < low <= summary["ratio_median"] <= high


def test_trainer_overhead_torch_refuses_a_batch_the_ranks_cannot_split(capsys):
    with pytest.raises(SystemExit) as exit_:
        load("trainer_overhead_torch").parse_args(["--global-batch-size", "33"])
    assert exit_.value.code == 2
    assert "--global-batch-size must be a multiple of the 2 ranks, got 33" in capsys.readouterr().err
