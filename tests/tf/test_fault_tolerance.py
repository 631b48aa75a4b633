"""Crash-safe checkpoints, exact and elastic resume, the audit trail and NaN recovery, end to end.

One driver process (``_fault_driver.py``, hard timeout) runs every scenario with real
``evenflow train`` processes and writes what it saw to JSON; the tests below assert on
their own part of it:

* 10 ``kill -9`` of one run directory (4 epochs of 15 steps) at random points (5 inside
  checkpoint saves via the ``EVENFLOW_FAULT`` hook, 2 after a random number of steps, 3
  by an external SIGKILL at a random moment while saves are slowed), then the same
  command to the end:
  the final model *and optimizer* state are bitwise equal to an uninterrupted run
  (1 CPU replica, ``--deterministic``), and the audit trail is exactly-once;
* 2 replicas killed mid-epoch, resumed with 3: the rest of the epoch is covered once;
* NaN features in 4 samples: every step holding one is skipped and logged with its
  ids, three consecutive ones trigger one restore with the learning rate halved, and
  no checkpoint holds a NaN;
* SGD at a learning rate of 1000: non-finite steps in a row, a restore with the rate
  lowered 1000x, and the run ends finite.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("_fault_driver.py")
SRC = Path(__file__).resolve().parents[2] / "src"
TIMEOUT = 420

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("faults")
    seed = int(os.environ.get("EVENFLOW_FAULT_SEED", random.randrange(10**6)))
    out = work / "out.json"
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    cmd = ["timeout", "-k", "5", str(TIMEOUT), sys.executable, str(DRIVER), str(work), str(out), str(seed)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT + 30)
    if proc.returncode != 0 or not out.exists():
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(work.glob("*.log"))[-3:])
        pytest.fail(f"fault driver (seed {seed}; rerun with EVENFLOW_FAULT_SEED={seed}) ended with "
                    f"{proc.returncode}:\n{proc.stderr[-3000:]}{logs}")
    result = json.loads(out.read_text())
    result["work"] = str(work)
    return result


def _clean(epochs: list[dict], n: int) -> None:
    assert [e["epoch"] for e in epochs] == list(range(n))
    for e in epochs:
        assert e["clean"] and e["complete"], e
        assert (e["num_duplicates"], e["num_misses"], e["bad_steps"]) == (0, 0, []), e


def test_kill9_anywhere_then_resume_is_bitwise_exact(runs):
    kills = runs["crash"]["kills"]
    seed = runs["seed"]
    assert len(kills) >= 10, f"seed {seed}: the run finished after {len(kills)} kills: {kills}"
    assert all(k["ended"] == ["signal", 9] for k in kills), kills
    # Kills inside a save leave its hidden temporary directory behind, never a half checkpoint.
    assert sum(bool(k["tmp_left"]) for k in kills) >= 3, kills
    # Later processes resumed from checkpoints written by earlier ones, and made progress.
    assert sum(k["before"] is not None for k in kills) >= 5
    assert kills[-1]["after"] is not None and kills[-1]["after"] != {"epoch": 0, "step": 0}
    assert runs["crash"]["final_resumed"], runs["crash"]["final_log"]
    assert runs["bitwise_equal"], f"seed {seed}: final state differs from the uninterrupted run"
    assert runs["num_variables"] == 20  # 6 model weights + 14 optimizer variables (step, lr, moments)
    _clean(runs["audit"]["crash"], 4)
    assert all(e["replica_counts"] == [1] for e in runs["audit"]["crash"])
    code, text = runs["audit_cli"]
    assert code == 0 and json.loads(text)["clean"] is True
    crash, ref = runs["summaries"]["crash"], runs["summaries"]["reference"]
    assert crash["test_accuracy"] == ref["test_accuracy"] and crash["test_loss"] == ref["test_loss"]
    for a, b in zip(crash["history"], ref["history"]):  # epoch figures stitched from partial sums
        assert a["samples"] == b["samples"] == 240
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-12)
    assert crash["resumed_from"] is not None


def test_resume_on_more_replicas_covers_the_rest_of_the_epoch_once(runs):
    el = runs["elastic"]
    assert el["first"] == ["signal", 9]
    assert el["cut"]["epoch"] == 1 and 0 < el["cut"]["step"] < 15, el
    audit = runs["audit"]["elastic"]
    _clean(audit, 4)
    assert [e["replica_counts"] for e in audit] == [[2], [2, 3], [3], [3]]
    # World-size invariant steps: the weights stay those of the 1-replica run, to float32 rounding.
    assert runs["elastic_max_abs_diff"] < 1e-4
    summary = runs["summaries"]["elastic"]
    assert summary["replicas"] == 3 and [h["samples"] for h in summary["history"]] == [240] * 4


def test_poisoned_samples_are_skipped_logged_and_recovered_from(runs):
    p = runs["poison"]
    bad = set(p["bad_ids"])
    nonfinite = [e for e in p["events"] if e["event"] == "nonfinite"]
    restores = [e for e in p["events"] if e["event"] == "restored"]
    first_pass = {(e["epoch"], e["step"]) for e in nonfinite if not e["replay"]}
    expected = {(int(ep), s) for ep, steps in p["expected"].items() for s in steps}
    assert first_pass == expected
    for e in nonfinite:
        assert e["skipped"]
        assert e["ids"] == p["plan_ids"][f"{e['epoch']}-{e['step']}"]  # the step's samples, all replicas
        assert e["suspects"] == sorted(bad & set(e["ids"]))             # exactly the NaN samples in it
    # Steps 4, 5, 6 of epoch 0 in a row -> one restore, lr halved, of the newest *confirmed*
    # checkpoint: the untrained one (the one at step 4 was followed by a bad step at once, and
    # the step-1 anomaly kept the step-2 save from happening). Replayed with the lower rate the
    # same steps fail again, so they are bad data: skipped, no second restore.
    assert len(restores) == 1
    assert restores[0]["to"] == {"epoch": 0, "step": 0}
    assert restores[0]["learning_rate"] == pytest.approx([0.01, 0.005])
    assert sorted(e["step"] for e in nonfinite if e["replay"]) == [1, 4, 5, 6]
    summary = p["summary"]
    assert summary["learning_rate"] == pytest.approx(0.005)
    assert summary["anomalies"]["restores"] == 1
    assert all(map(lambda h: h["loss"] is not None, summary["history"]))  # the epoch means stayed finite
    audit = runs["audit"]["poison"]
    _clean(audit, 2)  # skipped steps were visited once: still exactly-once
    assert [e["skipped_steps"] for e in audit] == [p["expected"]["0"], p["expected"]["1"]]
    assert runs["finite"]["poison"] and all(runs["finite"]["poison"].values())
    assert runs["finite"]["crash"] and all(runs["finite"]["crash"].values())
    assert runs["nan_model"] == {"refused": True, "written": []}


def test_a_diverging_model_is_restored_with_a_lower_learning_rate(runs):
    d = runs["diverge"]
    restores = [e for e in d["events"] if e["event"] == "restored"]
    assert restores, "SGD at learning rate 1000 did not diverge on this data"
    for i, r in enumerate(restores):  # each restore lowers the rate in use 1000x
        assert r["learning_rate"] == pytest.approx([1000.0 * 1e-3 ** i, 1000.0 * 1e-3 ** (i + 1)])
        assert r["to"] == {"epoch": 0, "step": 0}  # the only confirmed checkpoint: the untrained model
    assert d["summary"]["learning_rate"] == pytest.approx(1000.0 * 1e-3 ** len(restores))
    assert d["summary"]["history"][-1]["loss"] is not None  # finite in the end
    assert all(runs["finite"]["diverge"].values())
