"""`evenflow train --framework torch` on 3 gloo ranks: kill -9 one rank mid-epoch, rerun the same command.

N = 250 samples (200 to train) and a global batch of 32: 7 steps per epoch, the last one of 8
samples, which 3 ranks cannot split evenly. The model has dropout, so a resume is bitwise only
if every rank's random state came back with the weights (``--deterministic``). The killed run
and an uninterrupted one end with the same bits; the audit of the killed-and-resumed run is
exactly once; and ``evenflow report`` reads the torch run's telemetry like a TensorFlow run's.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.torch.conftest import SRC, rank_python, run_ranks

pytestmark = pytest.mark.slow
safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(250, 6)).astype(np.float32)
    np.savez(root / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0))

    python = rank_python()  # the ranks start warm; rank 1 kills itself with SIGKILL as a fresh process would

    def argv(run_dir):
        return lambda r: [*python, "-m", "evenflow", "train", "--framework", "torch", "--dataset",
                          str(root / "d.npz"), "--model", "mlp", "--dropout", "0.3", "--deterministic", "--audit",
                          "--epochs", "2", "--global-batch-size", "32", "--checkpoint-every", "2", "--loader-workers",
                          "0", "--collective-timeout", "60", "--learning-rate", "0.01", "--output-dir",
                          str(root / run_dir)]

    # The uninterrupted run and the one whose rank 1 is killed at its 9th update (epoch 1, step 2).
    kill = {"EVENFLOW_FAULT": "kill:step:9"}
    whole, killed = run_ranks([(argv("whole"), 3, lambda r: None),
                               (argv("killed"), 3, lambda r: None, lambda r: kill if r == 1 else {})], timeout=240)
    (again,) = run_ranks([(argv("killed"), 3, lambda r: None)], timeout=240)
    return {"root": root, "whole": whole, "killed": killed, "again": again}


def _final_weights(run_dir):
    last = sorted((run_dir / "checkpoints").glob("ckpt-*"))[-1]
    assert last.name == "ckpt-00002-000000"
    return safetensors_numpy.load_file(str(last / "model.safetensors"))


def test_the_killed_rank_stops_the_others_with_one_clear_line(runs):
    whole, killed = runs["whole"], runs["killed"]
    assert [r.returncode for r in whole] == [0, 0, 0], whole[0].stderr[-2000:]
    assert killed[1].returncode == -9
    # The newest checkpoint when rank 1 died at its 9th update: the end of epoch 0, which the rerun resumes from.
    newest = runs["root"] / "killed" / "checkpoints" / "ckpt-00001-000000"
    for r in (0, 2):
        err = killed[r].stderr.strip().splitlines()
        assert killed[r].returncode == 1, killed[r].stderr[-2000:]
        assert err[-1].startswith(f"evenflow train: error: rank {r} of 3 lost contact with another rank after "
                                  f"Cursor(1, 2) ("), err[-1]
        assert err[-1].endswith(f"); run the same command again to resume from {newest} (epoch 1 step 0)"), err[-1]


def test_the_rerun_resumes_exactly_once_and_ends_bitwise_like_the_uninterrupted_run(runs):
    root = runs["root"]
    assert [r.returncode for r in runs["again"]] == [0, 0, 0], runs["again"][0].stderr[-3000:]
    audit = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(root / "killed"), "--json"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}, timeout=60)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert json.loads(audit.stdout)["clean"] is True
    summary = json.loads((root / "killed" / "summary.json").read_text())
    assert summary["resumed_from"]["epoch"] == 1 and summary["framework"] == "torch"
    whole, resumed = _final_weights(root / "whole"), _final_weights(root / "killed")
    assert sorted(whole) == sorted(resumed)
    for name in whole:
        np.testing.assert_array_equal(whole[name], resumed[name], err_msg=name)
    ref = json.loads((root / "whole" / "summary.json").read_text())
    assert (summary["test_loss"], summary["test_accuracy"]) == (ref["test_loss"], ref["test_accuracy"])


def test_report_reads_a_torch_run_like_a_tensorflow_run(runs):
    from evenflow.report.telemetry import diagnose_phases, load_telemetry

    run_dir = runs["root"] / "whole"
    tel = load_telemetry(run_dir)
    assert tel.replicas == 3 and tel.num_updates == 14
    assert set(diagnose_phases(tel)) == {"whole run"}
    report = subprocess.run([sys.executable, "-m", "evenflow", "report", str(run_dir)], capture_output=True,
                            text=True, env={"PYTHONPATH": str(SRC)}, timeout=60)
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report.html").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
