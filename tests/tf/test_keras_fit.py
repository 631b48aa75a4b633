"""``evenflow.tf.fit``: the user's compiled loss and metrics, exact on any number of replicas, resumable, audited.

N = 203 with ``validation_split=0.2`` (162 train, 41 validate), global batch 30: every epoch
ends with a padded step, and on 4 replicas most steps are padded. The reference is one
device without a strategy running ``train_on_batch`` on each step's real samples.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from tests._warm import warm_python

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_keras_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
SPEC = {"n": 203, "batch": 30, "epochs": 2, "seed": 4}


def run_fit(tmp_path, spec: dict, timeout: float = 240, fault: str | None = None) -> tuple[int, dict, str]:
    tag = f"fit-{len(list(tmp_path.iterdir()))}"
    spec_path, out = tmp_path / f"{tag}.json", tmp_path / f"{tag}.npz"
    spec_path.write_text(json.dumps({**SPEC, **spec}))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC))
    if fault:
        env["EVENFLOW_FAULT"] = fault
    try:
        proc = subprocess.run(["timeout", "-k", "5", str(timeout), *warm_python(env), str(WORKER), str(spec_path),
                               str(out)], env=env, capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the fit worker did not finish within {timeout} s")
    found = {}
    if out.exists():
        with np.load(out, allow_pickle=False) as z:
            found = {k: z[k] for k in z.files}
    return proc.returncode, found, proc.stderr + proc.stdout


def weights(found: dict, prefix: str) -> list[np.ndarray]:
    return [found[f"{prefix}{i}"] for i in range(len([k for k in found if k[len(prefix):].isdigit()
                                                      and k.startswith(prefix)]))]


@pytest.mark.parametrize("replicas,model", [(1, "sequential"), (4, "subclassed")])
def test_fit_equals_one_device_on_the_same_samples(tmp_path, replicas, model):
    rc, found, err = run_fit(tmp_path, {"replicas": replicas, "model": model, "reference": True,
                                        "output_dir": str(tmp_path / "run"), "audit": True})
    assert rc == 0, err[-3000:]
    fit_w, ref_w = weights(found, "fit"), weights(found, "ref")
    assert len(fit_w) == len(ref_w) == 4
    for a, b in zip(fit_w, ref_w):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # The displayed figures: each epoch's loss (regularization included) and accuracy over its
    # 162 samples, and validation over the 41 held-out ones, as one device computes them.
    np.testing.assert_allclose(found["fit_loss"], found["ref_loss"], rtol=1e-5)
    np.testing.assert_allclose(found["fit_accuracy"], found["ref_accuracy"], atol=1e-6)
    assert float(found["fit_val_loss"][-1]) == pytest.approx(float(found["ref_val_loss"]), rel=1e-5)
    assert float(found["fit_val_accuracy"][-1]) == pytest.approx(float(found["ref_val_accuracy"]), abs=1e-6)
    # weighted_metrics see real rows only: the cross-entropy metric equals the data loss.
    assert float(found["fit_val_sparse_categorical_crossentropy"][-1]) <= float(found["fit_val_loss"][-1])
    from evenflow.run.audit import check_audit
    audits = check_audit(tmp_path / "run")
    assert [a.epoch for a in audits] == [0, 1] and all(a.clean and a.complete for a in audits)


@pytest.mark.parametrize("kind", ["class", "sample"])
def test_class_and_sample_weights_on_two_replicas_equal_one_device_with_them(tmp_path, kind):
    # Keras weights a batch's loss as sum(w * loss) / batch size; evenflow's exact loss over the
    # step's real samples does the same, padding or not, and val_loss takes the split's sample weights.
    rc, found, err = run_fit(tmp_path, {"replicas": 2, "reference": True, "weights": kind})
    assert rc == 0, err[-3000:]
    for a, b in zip(weights(found, "fit"), weights(found, "ref"), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(found["fit_loss"], found["ref_loss"], rtol=1e-5)
    assert float(found["fit_val_loss"][-1]) == pytest.approx(float(found["ref_val_loss"]), rel=1e-5)
    assert float(found["fit_val_sparse_categorical_crossentropy"][-1]) == pytest.approx(
        float(found["ref_val_sparse_categorical_crossentropy"]), rel=1e-5)  # weighted_metrics get the weights


def test_a_killed_fit_resumes_mid_epoch_to_the_same_weights(tmp_path, capsys):
    spec = {"replicas": 2, "epochs": 3, "checkpoint_every": 2, "audit": True, "verbose": 2}
    rc, whole, err = run_fit(tmp_path, {**spec, "output_dir": str(tmp_path / "whole")})
    assert rc == 0, err[-3000:]
    run = str(tmp_path / "cut")
    rc, _, _ = run_fit(tmp_path, {**spec, "output_dir": run}, fault="kill:step:10")  # epoch 1, after step 4
    assert rc != 0
    rc, resumed, err = run_fit(tmp_path, {**spec, "output_dir": run})
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and "epoch 1 step 2 (Keras's Epoch 2/" in err
    for a, b in zip(weights(resumed, "fit"), weights(whole, "fit")):
        np.testing.assert_array_equal(a, b)
    # One run: the History holds epoch 0 (saved by the killed call), the rest of epoch 1 and epoch 2,
    # and the progress counts the run's epochs.
    assert len(resumed["fit_loss"]) == 3 and resumed["fit_loss"][0] == whole["fit_loss"][0]
    assert "Epoch 2/3" in err and "Epoch 3/3" in err and "Epoch 1/2" not in err and "Epoch 2/2" not in err
    assert float(resumed["fit_val_loss"][-1]) == float(whole["fit_val_loss"][-1])
    rc, again, err = run_fit(tmp_path, {**spec, "output_dir": run})  # a finished run: nothing to train
    assert rc == 0 and "has trained all 3 epochs; nothing to train" in err and "Epoch 4/3" not in err, err[-3000:]
    np.testing.assert_array_equal(again["fit_loss"], resumed["fit_loss"])
    np.testing.assert_array_equal(again["fit_val_loss"], resumed["fit_val_loss"])
    capsys.readouterr()
    code = main(["audit", run])
    out = capsys.readouterr()
    assert code == 0 and "3 epochs: every sample exactly once" in out.out, out.out + out.err


def test_fit_moves_samples_away_from_a_slow_replica(tmp_path):
    run = tmp_path / "run"
    rc, found, err = run_fit(tmp_path, {"replicas": 2, "n": 600, "batch": 64, "epochs": 3, "rebalance": "payback0",
                                        "slow": [1, 3.0], "output_dir": str(run), "audit": True})
    assert rc == 0, err[-3000:]
    lines = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    replans = [line for line in lines if line["kind"] == "rebalance"]
    assert replans and replans[0]["step"] == 0 and replans[0]["after"][1] < 0.6, replans
    from evenflow.run.audit import check_audit
    assert all(a.clean and a.complete for a in check_audit(run))
