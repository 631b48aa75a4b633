"""One definition per figure: `evenflow inspect` (text and --json) and the run report compute each
figure as docs/plan.md defines it, here by hand on small plans.

* imbalance of a load, per step: the busiest replica's load over its fair share of the step's total
  (equal weights: max / mean); cost imbalance of real cost, padded imbalance of padded tokens,
  compute imbalance (the report) of compute seconds;
* padding slots count empty slots; padding share = padding tokens / computed tokens = 1 - token efficiency.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main
from evenflow.report.telemetry import diagnose, load_telemetry

COSTS = np.array([5, 1, 7, 3, 2, 8, 4, 6, 9, 2, 3, 1, 7, 5], dtype=np.float64)
G = 6


def _inspect(capsys, *argv) -> tuple[str, dict]:
    """``(text, json)`` of one inspect, run twice: without and with --json."""
    assert main(["inspect", *argv]) == 0
    text = capsys.readouterr().out
    assert main(["inspect", *argv, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def _by_hand(ids: np.ndarray, weights: list[float]) -> tuple[float, float]:
    """Mean over steps of ``(cost imbalance, padded imbalance)``, from the ids alone."""
    shares = np.asarray(weights) / sum(weights)
    cost, padded = [], []
    for step in ids:  # [replicas, slots]
        real = [COSTS[row[row >= 0]] for row in step]
        loads = np.array([c.sum() for c in real])
        pads = np.array([c.max() * c.size if c.size else 0.0 for c in real])
        cost.append(max(loads / shares) / loads.sum())
        padded.append(max(pads / shares) / pads.sum())
    return float(np.mean(cost)), float(np.mean(padded))


@pytest.mark.parametrize("weights", [[1.0, 1.0], [2.0, 1.0]])
def test_inspect_shows_each_imbalance_as_defined(tmp_path, capsys, weights):
    np.save(tmp_path / "costs.npy", COSTS)
    plan = ef.Plan(ef.Index(len(COSTS), costs=COSTS), ef.Topology(2, weights=weights), global_batch_size=G,
                   balance="cost")
    cost, padded = _by_hand(plan.epoch(0).ids, weights)
    text, got = _inspect(capsys, "--costs", str(tmp_path / "costs.npy"), "--replicas", "2", "--batch-size",
                         str(G), "--balance", "cost", "--weights", ",".join(map(str, weights)))
    assert got["imbalance_mean"] == pytest.approx(cost)
    assert re.search(rf"cost imbalance \(per step, busiest replica's cost / its fair share\): mean {cost:.4f} ", text)
    row = next(r for r in got["modes"] if r["mode"] == "cost")  # the inspected plan's mode, padded
    assert row["padded_imbalance_mean"] == pytest.approx(padded)
    assert re.search(rf"^cost +\d+ +\d+ +\d+ +{padded:.3f} ", text, re.M)
    if weights[0] != weights[1]:
        assert cost > 1.0 + 1e-3 and padded > 1.0 + 1e-3  # the by-hand figures tell the weights apart


def test_the_report_measures_compute_imbalance_the_same_way(tmp_path, capsys):
    """Compute seconds equal to the plan's per-replica cost: the report's imbalance is inspect's."""
    np.save(tmp_path / "costs.npy", COSTS)
    plan = ef.Plan(ef.Index(len(COSTS), costs=COSTS), ef.Topology(2), global_batch_size=G, balance="cost")
    ids = plan.epoch(0).ids
    _, got = _inspect(capsys, "--costs", str(tmp_path / "costs.npy"), "--replicas", "2", "--batch-size", str(G),
                      "--balance", "cost")
    head = {"kind": "run", "replicas": 2, "workers": 1, "global_batch_size": G, "steps_per_epoch": len(ids),
            "load_unit": "cost"}
    lines = [head]
    for s, step in enumerate(ids):
        compute = [float(COSTS[row[row >= 0]].sum()) for row in step]
        lines.append({"kind": "step", "epoch": 0, "step": s, "global_step": s, "weights": [1.0, 1.0],
                      "samples": [int((row >= 0).sum()) for row in step], "cost": compute, "compute": compute,
                      "input_wait": 0.0, "step_seconds": max(compute)})
    run = tmp_path / "run"
    run.mkdir()
    (run / "telemetry.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = diagnose(load_telemetry(run)).imbalance
    assert report == pytest.approx(got["imbalance_mean"]) and report == pytest.approx(_by_hand(ids, [1, 1])[0])


def test_a_packed_plan_shows_padding_as_tokens_consistent_with_token_efficiency(tmp_path, capsys):
    costs = np.tile(COSTS, 20)
    np.save(tmp_path / "costs.npy", costs)
    L, packs = 16, 4
    text, got = _inspect(capsys, "--costs", str(tmp_path / "costs.npy"), "--replicas", "2", "--batch-size",
                         str(packs), "--pack", str(L), "--balance", "cost")
    computed = got["num_steps"] * 2 * got["rows"] * L  # every replica computes its batch [rows, L] each step
    padding = computed - costs.sum()
    assert got["token_efficiency"] == pytest.approx(costs.sum() / computed)
    assert sum(r["padding_tokens"] for r in got["per_replica"]) == pytest.approx(padding)
    assert got["padding_share"] == pytest.approx(padding / computed)
    assert got["padding_share"] == pytest.approx(1.0 - got["token_efficiency"])
    assert got["padding_share"] < 0.2  # slots are another figure: most of a packed plan's slots are empty
    slots = sum(r["padding_slots"] for r in got["per_replica"])
    assert slots / (got["num_steps"] * 2 * got["slots"]) > 0.5
    m = re.search(r"token efficiency \(real tokens / rows x L\): ([\d.]+); padding share \(padding / computed "
                  r"tokens\) ([\d.]+)", text)
    assert m and float(m[2]) == pytest.approx(1.0 - float(m[1]), abs=1.1e-4)
    assert re.search(r"^replica +weight +real +padding slots +cost +padding tokens$", text, re.M)
    pack_row = next(r for r in got["modes"] if r["mode"].startswith("pack"))
    assert pack_row["padded_imbalance_mean"] == 1.0  # every replica computes the same [rows, L]
