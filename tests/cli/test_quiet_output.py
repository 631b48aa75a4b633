"""What a person sees: no TensorFlow C++ start-up lines unless asked for, and one epoch numbering
(from 0) in the messages, telemetry.jsonl, ``evenflow audit`` and summary.json."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
# Lines TensorFlow's C++ libraries print while they load or start (absl, oneDNN, CPU features, CUDA probes).
CHATTER = re.compile(r"absl::InitializeLog|oneDNN custom operations|cpu_feature_guard|port\.cc:|cuda drivers|"
                     r"^[IW]\d{4} \d\d:\d\d:", re.M)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "EVENFLOW_VERBOSE")}
    return dict(env, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", **extra)


def _evenflow(*args, env=None):
    return subprocess.run([sys.executable, "-m", "evenflow", *args], capture_output=True, text=True, timeout=300,
                          env=env or _env())


def test_train_is_quiet_and_numbers_epochs_the_same_everywhere(tmp_path):
    run = tmp_path / "run"
    common = ["train", "--dataset", "builtin:digits", "--replicas", "2", "--global-batch-size", "256",
              "--test-fraction", "0.5", "--audit", "--output-dir", str(run)]
    first = _evenflow(*common, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not CHATTER.search(first.stdout + first.stderr), first.stderr  # no TensorFlow start-up lines
    assert "1 epoch (0)" in first.stdout and re.search(r"^epoch 0 \(1/1\) ", first.stderr, re.M), first.stderr
    # The same command for 2 epochs resumes after epoch 0; --verbose lets TensorFlow's own lines through.
    second = _evenflow(*common, "--epochs", "2", "--verbose")
    assert second.returncode == 0, second.stderr[-3000:]
    assert CHATTER.search(second.stderr), second.stderr[:2000]
    resumed = re.search(r"^resuming from \S+: epoch (\d+) step (\d+) ", second.stdout, re.M)
    assert resumed and (int(resumed[1]), int(resumed[2])) == (1, 0), second.stdout
    assert re.search(r"^epoch 1 \(2/2\) ", second.stderr, re.M) and "2 epochs (0-1)" in second.stdout

    lines = [json.loads(x) for x in (run / "telemetry.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    assert sorted({x["epoch"] for x in steps}) == [0, 1]
    assert [x["step"] for x in steps if x["epoch"] == 1][0] == 0  # the resumed part starts where "resuming from" said

    audit = _evenflow("audit", str(run))
    assert audit.returncode == 0, audit.stderr
    rows = re.findall(r"^\s*(\d+)\s+\d+/\d+\s.*exactly once$", audit.stdout, re.M)
    assert rows == ["0", "1"], audit.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [0, 1]
    assert summary["resumed_from"] == {"epoch": 1, "step": 0}


def test_a_users_own_tf_log_level_is_kept():
    code = "from evenflow.tf._lazy import tf; tf()"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=_env(TF_CPP_MIN_LOG_LEVEL="0"))
    assert shown.returncode == 0 and CHATTER.search(shown.stderr), shown.stderr


def test_launch_passes_verbose_to_every_worker():
    probe = "import os; print(os.environ.get('EVENFLOW_VERBOSE'))"
    quiet = _evenflow("launch", "--workers", "2", "--share-network", "--", sys.executable, "-c", probe)
    loud = _evenflow("launch", "--verbose", "--workers", "2", "--share-network", "--", sys.executable, "-c", probe)
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert sorted(quiet.stdout.splitlines()) == ["[worker 0] None", "[worker 1] None"]
    assert sorted(loud.stdout.splitlines()) == ["[worker 0] 1", "[worker 1] 1"]
