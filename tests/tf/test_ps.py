"""Parameter-server training on real processes (127.0.0.1): 2 workers, 2 parameter servers, a chief.

N = 203 samples, a global batch of 30 (7 steps, the last of 23 samples), an MLP whose first
kernel is split across the two parameter servers. The chief (``_ps_chief.py``) schedules each
plan step on a free worker and records what it reads back; ``check_audit`` then says whether
every sample was trained exactly once per epoch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evenflow.run import check_audit
from evenflow.tf.launch.local import free_ports
from tests._warm import warm_python

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
CHIEF = Path(__file__).with_name("_ps_chief.py")
SPEC = {"n": 203, "classes": 4, "batch": 30, "epochs": 2, "seed": 3, "lr": 0.1, "eval_n": 31, "checkpoint_every": 2}


def _env(cluster: dict, kind: str, index: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3",
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))
    env.pop("EVENFLOW_REPLICAS_PER_WORKER", None)
    return env


@pytest.fixture(scope="module")
def cluster():
    """Start 2 worker and 2 ps servers for this module's chiefs, one after another (the test that kills a
    worker comes last); yield ``(cluster, {(kind, index): Popen})``; kill them afterwards."""
    ports = free_ports(5)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
            "ps": [f"127.0.0.1:{p}" for p in ports[3:5]]}
    # Started warm (tests/_warm.py); the worker a test kills is killed by SIGKILL, which ends its program too.
    servers = {(kind, i): subprocess.Popen([*warm_python(_env(spec, kind, i)), "-m", "evenflow.tf.ps.training"],
                                           env=_env(spec, kind, i), stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
               for kind in ("worker", "ps") for i in range(2)}
    try:
        yield spec, servers
    finally:
        for p in servers.values():
            p.kill()
            p.wait()


def _chief(tmp: Path, spec: dict, cluster: dict, name: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    out = tmp / f"{name}.npz"
    env = _env(cluster, "chief", 0)
    proc = subprocess.run(["timeout", "-k", "5", str(timeout), *warm_python(env), str(CHIEF), str(tmp / f"{name}.json"),
                           str(out)], env=env, capture_output=True, text=True)
    found = None
    if out.exists():
        with np.load(out) as z:
            found = {k: z[k] for k in z.files}
    return proc, found


def test_every_step_runs_once_on_some_worker_and_evaluation_counts_each_sample_once(cluster, tmp_path):
    spec, _ = cluster
    run = tmp_path / "run"
    proc, found = _chief(tmp_path, dict(SPEC, run_dir=str(run)), spec, "chief")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert found["epoch_samples"].tolist() == [203, 203]
    assert int(found["eval_count"]) == SPEC["eval_n"]
    assert found["kernel_shards"][0] == 2  # the first kernel is split across the two parameter servers
    # A table of 1,001 rows: one block per parameter server, within one row of even.
    assert sorted(found["table_rows"].tolist()) == [500, 501]
    assert sorted(str(d).split("/task:")[1][0] for d in found["table_devices"]) == ["0", "1"]
    assert all("/job:ps/" in str(d) for d in found["table_devices"])
    audits = check_audit(run)
    assert [a.epoch for a in audits] == [0, 1] and all(a.complete and a.clean and a.samples == SPEC["n"] for a in audits), audits


def test_a_killed_chief_is_rerun_and_resumes_from_its_checkpoint(cluster, tmp_path):
    spec, _ = cluster
    run = tmp_path / "run"
    proc, _ = _chief(tmp_path, dict(SPEC, run_dir=str(run), kill=[0, 1, 3]), spec, "first")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    time.sleep(1)
    proc, found = _chief(tmp_path, dict(SPEC, run_dir=str(run), resume=True), spec, "again")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert found["start"].tolist() == [1, 2]  # the checkpoint before the chief died (every 2 steps)
    assert int(found["eval_count"]) == SPEC["eval_n"]
    audits = check_audit(run)
    assert [a.epoch for a in audits] == [0, 1] and all(a.complete and a.clean and a.samples == SPEC["n"] for a in audits), audits


def test_a_killed_worker_leaves_the_other_to_finish_with_the_audit_exactly_once(cluster, tmp_path):
    spec, servers = cluster
    run = tmp_path / "run"
    victim = servers[("worker", 0)]
    proc, found = _chief(tmp_path, dict(SPEC, run_dir=str(run), kill=[victim.pid, 0, 3]), spec, "chief")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert found["epoch_samples"].tolist() == [203, 203] and int(found["eval_count"]) == SPEC["eval_n"]
    assert all(a.complete and a.clean and a.samples == SPEC["n"] for a in check_audit(run))


def _launch_ps(run: Path, *flags: str) -> subprocess.CompletedProcess:
    # Workers pinned one per core: a server with one core must still have the threads a closure needs. The
    # tasks start warm (tests/_warm.py: on the cores the launcher pins, with the TF_CONFIG it gives each).
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    cmd = [sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--ps", "2", "--pin-cores", "--",
           *warm_python(env), "-m",
           "evenflow", "train", "--strategy", "ps", "--dataset", "builtin:digits", "--audit", "--output-dir", str(run),
           *flags]
    return subprocess.run(["timeout", "-k", "5", "240", *cmd], env=env, capture_output=True, text=True)


def test_evenflow_launch_with_ps_trains_on_the_chief_and_the_same_command_resumes(tmp_path):
    from evenflow.cli import main

    run = tmp_path / "run"
    first = _launch_ps(run, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[worker 1] evenflow train: serving as worker 1" in first.stdout and "[ps 0]" in first.stdout
    assert "359/359 test samples, each counted once" in first.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["framework_info"]["strategy"].startswith("ParameterServerStrategy")
    assert summary["framework_info"]["parameter_servers"] == 2 and summary["replicas"] == 1
    assert not (run / "telemetry.jsonl").exists()  # said so: no per-replica speeds under dispatch
    again = _launch_ps(run, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stdout
    assert [h["epoch"] for h in json.loads((run / "summary.json").read_text())["history"]] == [0, 1]
    assert main(["audit", str(run)]) == 0  # every sample exactly once in both epochs


@pytest.mark.parametrize("flags,message", [
    (["--model", "cnn"], "--model cnn is not supported with --strategy ps"),
    (["--replicas", "2"], "--replicas 2 is not supported with --strategy ps"),
    (["--rebalance", "on"], "--rebalance on is not supported with --strategy ps"),
    (["--accumulate-steps", "2"], "--accumulate-steps 2 is not supported with --strategy ps"),
    (["--deterministic"], "--deterministic is not supported with --strategy ps"),
    (["--rebalance-threshold", "1.2"], "--rebalance-threshold 1.2 is not supported with --strategy ps"),
])
def test_what_a_parameter_server_run_cannot_honour_is_refused_in_one_line(tmp_path, capsys, monkeypatch, flags,
                                                                           message):
    from evenflow.cli import main

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    code = main(["train", "--strategy", "ps", "--dataset", "builtin:digits", *flags, "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_a_ps_run_without_a_parameter_server_cluster_says_how_to_make_one(tmp_path, capsys, monkeypatch):
    from evenflow.cli import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    code = main(["train", "--strategy", "ps", "--dataset", "builtin:digits", "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "needs TF_CONFIG with chief, worker and ps tasks" in err and "--ps 2" in err, err
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    code = main(["train", "--strategy", "ps", "--dataset", "builtin:digits", "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "exactly 1 chief, >= 1 worker and >= 1 ps" in err, err


def _task_pids(kind: str, launcher_pid: int) -> list[int]:
    """Pids of the launch's processes whose TF_CONFIG task is ``kind``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().split()
        except OSError:
            continue
        config = next((v[len(b"TF_CONFIG="):] for v in environ if v.startswith(b"TF_CONFIG=")), None)
        if config and json.loads(config)["task"]["type"] == kind and int(stat[3]) == launcher_pid:
            found.append(int(entry.name))
    return found


def test_a_dead_parameter_server_stops_the_chief_with_one_line(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "evenflow", "launch", "--workers", "1", "--ps", "1", "--share-network", "--",
           sys.executable, "-m", "evenflow", "train", "--strategy", "ps", "--dataset", "builtin:digits", "--epochs",
           "50", "--output-dir", str(run)]
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    launch = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a start-up beside other tests on a shared machine can be slow
        while not (run / "checkpoints" / "ckpt-00000-000000").is_dir() and time.monotonic() < deadline:
            assert launch.poll() is None, launch.communicate()[1][-3000:]
            time.sleep(0.2)
        assert (run / "checkpoints" / "ckpt-00000-000000").is_dir(), "no first checkpoint within 300 s"
        (ps,) = _task_pids("ps", launch.pid)
        os.kill(ps, signal.SIGKILL)
        out, err = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 1, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("[chief] evenflow train: error:")]
    assert len(lines) == 1 and "a parameter server of the cluster" in lines[0] and "stopped answering" in lines[0], \
        err[-3000:]
    # It names the newest checkpoint on disk (ckpt-EEEEE-SSSSSS), which the same command resumes from.
    newest = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    epoch, step = int(newest.name[5:10]), int(newest.name[11:])
    assert lines[0].endswith(f"; restart it and run the same command again to resume from {newest} (epoch {epoch} "
                             f"step {step})"), lines[0]
