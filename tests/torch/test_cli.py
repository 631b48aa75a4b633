"""`evenflow train --framework torch`: under torchrun with 2 ranks on records, then resumed alone, then bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import convert

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    convert("builtin:digits", root / "digits", shards=2)
    return root


def test_torchrun_trains_two_ranks_and_a_single_process_rerun_resumes(digits, capsys, torchrun):
    run_dir = digits / "run"
    args = ["train", "--framework", "torch", "--dataset", str(digits / "digits"), "--epochs", "1",
            "--global-batch-size", "50", "--output-dir", str(run_dir), "--checkpoint-every", "10",
            "--collective-timeout", "30", "--loader-workers", "1"]
    done = torchrun(args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 rank(s) (DDP, backend gloo, cpu)" in done.stdout
    assert "359/359 test samples, each counted once" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["test_samples"] == 359
    (epoch,) = summary["history"]
    assert epoch["samples"] == 1438 and sum(epoch["replica_samples"]) == 1438
    per_replica = summary["telemetry"]["per_replica"]  # each rank's own compute time, measured
    assert len(per_replica) == 2 and min(r["compute_seconds"] for r in per_replica) > 0
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names[-2:] == ["ckpt-00000-000020", "ckpt-00001-000000"]  # every 10 steps and the epoch's end
    # The same command for 2 epochs, in one process: it resumes after epoch 0 on 1 rank (an elastic restart).
    capsys.readouterr()
    assert main([*args[:5], "--epochs", "2", *args[7:]]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "ckpt-00001-000000: epoch 1 step 0" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": 1, "step": 0} and summary["replicas"] == 1
    assert [h["epoch"] for h in summary["history"]] == [0, 1]  # the lineage of the final weights
    assert summary["history"][1]["samples"] == 1438
    assert summary["test_samples"] == 359 and summary["test_accuracy"] > 0.5


@pytest.mark.parametrize("flags,message", [
    (["--replicas", "3"], "replicas is 3 but this run has 1 process(es)"),
    (["--precision", "mixed_float16"], "not supported with --framework torch"),
    (["--model", "text_cnn"], "--model text_cnn is not supported with --framework torch: text_cnn is a TensorFlow"),
    (["--dataset", "builtin:stdlib-docs"], "is variable-length text, and text trains on TensorFlow only"),
    (["--loader-workers", "-1"], "loader_workers must be at least 0"),
    (["--model", "cnn", "--dataset", "FLAT"], "model 'cnn' needs image-shaped features"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, flags, message):
    flat = tmp_path / "flat.npz"
    np.savez(flat, x=np.ones((20, 3), np.float32), y=np.arange(20) % 2)
    flags = [str(flat) if f == "FLAT" else f for f in flags]
    argv = ["train", "--framework", "torch", "--dataset", "builtin:digits", "--output-dir", str(tmp_path / "out"),
            *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("evenflow train: error:")
    assert not (tmp_path / "out").exists()
