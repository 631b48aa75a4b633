"""The diagnosis says when a cost-balanced run's compute time does not follow its cost."""
from __future__ import annotations

import json

import numpy as np
import pytest

from evenflow.report.load_fit import cost_advice, per_unit_share
from evenflow.report.telemetry import diagnose, load_telemetry

R, N = 2, 30


def _loads(seed=0):
    rng = np.random.default_rng(seed)
    cost = rng.uniform(70, 1400, (N, R))        # bucketed steps: cheap and dear ones
    samples = rng.integers(20, 40, (N, R)).astype(float)
    return cost, samples


def _speed(r):
    return 3.0 if r == 1 else 1.0  # replica 1 three times slower


def test_time_per_sample_under_random_costs_is_named_with_the_fix():
    cost, samples = _loads()
    compute = 0.001 * samples * np.array([_speed(r) for r in range(R)])
    assert per_unit_share(cost, compute) < 0.25 < 0.9 < per_unit_share(samples, compute)
    advice = cost_advice(cost, samples, compute)
    assert advice is not None and "does not follow their cost" in advice
    assert "it follows their sample counts" in advice and "--balance count" in advice


@pytest.mark.parametrize("case", ["time follows cost", "cost barely varies", "too few updates"])
def test_nothing_is_said_where_cost_predicts_time_or_the_data_cannot_tell(case):
    cost, samples = _loads(1)
    compute = 0.0001 * cost * np.array([_speed(r) for r in range(R)]) + 0.002
    if case == "cost barely varies":
        cost = 1000 + cost / 100  # max / min under 1.5: no line can be told from noise
        compute = 0.05 + 0.01 * np.random.default_rng(2).random((N, R))
    if case == "too few updates":
        cost, samples, compute = cost[:5], samples[:5], 0.001 * samples[:5]
    assert cost_advice(cost, samples, compute) is None


def _run(tmp_path, load_unit, compute, cost, samples):
    head = {"kind": "run", "replicas": R, "workers": 1, "global_batch_size": 60, "steps_per_epoch": N,
            "load_unit": load_unit, "rebalance": True}
    lines = [head] + [{"kind": "step", "epoch": 0, "step": i, "global_step": i, "weights": [1.0] * R,
                       "samples": [int(x) for x in samples[i]], "cost": list(map(float, cost[i])),
                       "compute": list(map(float, compute[i])), "input_wait": 0.0,
                       "step_seconds": float(compute[i].max()) + 0.01} for i in range(N)]
    (tmp_path / "telemetry.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return diagnose(load_telemetry(tmp_path))


@pytest.mark.parametrize("load_unit", ["cost", "samples"])
def test_the_straggler_line_adds_it_in_cost_runs_only(tmp_path, load_unit):
    cost, samples = _loads()
    compute = 0.001 * samples * np.array([_speed(r) for r in range(R)])
    d = _run(tmp_path, load_unit, compute, cost, samples)
    assert d.kind == "straggler" and d.straggler == 1
    assert ("does not follow their cost" in d.text) == (load_unit == "cost")
