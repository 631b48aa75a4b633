"""The input-bound advice names the flags that change the run's own input cost, and no others."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evenflow.report.feed_advice import GENERAL, feed_advice
from evenflow.report.telemetry import diagnose, load_telemetry


def test_a_run_without_input_facts_gets_the_general_advice():
    assert feed_advice({}) == GENERAL
    assert feed_advice({"input": {"framework": "jax"}}) == GENERAL


def test_torch_names_its_loader_workers_and_augment_only_when_used():
    plain = feed_advice({"input": {"framework": "torch", "augment": False, "loader_workers": 1}})
    assert "--loader-workers (now 1;" in plain and "--augment" not in plain and "evenflow convert" not in plain
    augmented = feed_advice({"input": {"framework": "torch", "augment": True, "loader_workers": 0}})
    assert "--loader-workers (now 0;" in augmented and "--augment costs CPU per sample" in augmented
    assert max(len(a) for a in (GENERAL, plain, augmented)) <= 160  # one terminal line of the report


def test_tensorflow_has_no_loader_workers_to_name():
    advice = feed_advice({"input": {"framework": "tf", "augment": False}})
    assert advice.startswith("feed faster: ") and "--loader-workers" not in advice and "--augment" not in advice
    assert "--global-batch-size" in advice


def _input_bound(tmp_path, run_line):
    head = {"kind": "run", "replicas": 1, "workers": 1, "global_batch_size": 8, "steps_per_epoch": 10,
            "load_unit": "samples", **run_line}
    steps = [{"kind": "step", "epoch": 0, "step": i, "global_step": i, "weights": [1.0], "samples": [8],
              "cost": [8.0], "compute": [0.01], "input_wait": 0.02, "step_seconds": 0.04} for i in range(10)]
    (tmp_path / "telemetry.jsonl").write_text("\n".join(json.dumps(x) for x in [head, *steps]) + "\n")
    return diagnose(load_telemetry(tmp_path))


def test_the_diagnosis_line_carries_the_runs_own_advice(tmp_path):
    d = _input_bound(tmp_path, {"input": {"framework": "torch", "augment": False, "loader_workers": 2}})
    assert d.kind == "input-bound" and "--loader-workers (now 2;" in d.text and "--augment" not in d.text


@pytest.mark.slow
def test_evenflow_train_writes_its_input_facts_to_the_telemetry(tmp_path):
    pytest.importorskip("torch")
    run = subprocess.run(["timeout", "-k", "5", "180", sys.executable, "-m", "evenflow", "train", "--framework",
                          "torch", "--dataset", "builtin:digits", "--epochs", "1", "--loader-workers", "0",
                          "--output-dir", str(tmp_path / "r")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    head = json.loads((tmp_path / "r" / "telemetry.jsonl").read_text().splitlines()[0])
    assert head["input"] == {"framework": "torch", "augment": False, "loader_workers": 0}
