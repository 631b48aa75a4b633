"""``evenflow train --cluster``: a Slurm job step's variables make one multi-process run (tf and torch).

Two processes on 127.0.0.1 get what ``srun --ntasks=2`` on one node sets (``SLURM_JOB_ID``,
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_NODELIST``,
``SLURM_STEP_TASKS_PER_NODE`` and the job's ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``,
``SLURM_TASKS_PER_NODE``) and nothing else: no ``TF_CONFIG``, no ``torchrun``. They form one
2-worker (TensorFlow) or 2-rank (PyTorch) run that trains every sample exactly once.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from evenflow.cli import main
from evenflow.run.clusters import cluster_source, torchrun_env
from evenflow.run.slurm import expand_hostlist, expand_tasks_per_node, slurm_tasks

SRC = Path(__file__).resolve().parents[2] / "src"
RUNNERS = ("TF_CONFIG", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def slurm_env(rank: int, job_id: int, tasks: int = 2, nodes: str = "127.0.0.1") -> dict:
    per_node = str(tasks)
    return {"SLURM_JOB_ID": str(job_id), "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_JOB_NODELIST": nodes,
            "SLURM_STEP_NODELIST": nodes, "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_NODEID": "0"}


def test_hostlists_and_tasks_per_node_expand_as_slurm_writes_them():
    assert expand_hostlist("gpu[01-03,07],login,n[8-10]x") == ["gpu01", "gpu02", "gpu03", "gpu07", "login",
                                                                "n8x", "n9x", "n10x"]
    assert expand_hostlist("a[1-2]b[1-2]") == ["a1b1", "a1b2", "a2b1", "a2b2"]
    assert expand_hostlist("solo") == ["solo"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_slurm_variables_become_torchruns_for_the_task_that_reads_them():
    env = {**slurm_env(3, 4242, tasks=4, nodes="gpu[01-02]"), "SLURM_LOCALID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    tasks = slurm_tasks(env)
    assert (tasks.hosts, tasks.count, tasks.host, tasks.port_base) == (("gpu01", "gpu02"), 4, "gpu02", 24242)
    assert torchrun_env("auto", env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                         "MASTER_ADDR": "gpu01", "MASTER_PORT": "24242"}


def test_auto_prefers_the_frameworks_own_launcher_and_reads_slurm_only_for_several_tasks():
    env = slurm_env(0, 7)
    assert cluster_source("auto", "tf", env) == "slurm"
    assert cluster_source("auto", "torch", env) == "slurm"
    assert cluster_source("auto", "tf", {**env, "TF_CONFIG": '{"cluster": {}}'}) == "tf-config"
    assert cluster_source("auto", "torch", {**env, "WORLD_SIZE": "2"}) == "torchrun"
    assert cluster_source("auto", "tf", {**env, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}) == "alone"
    assert cluster_source("auto", "torch", {}) == "alone"


@pytest.mark.parametrize("framework,argv,fragment", [
    ("tf", ["--cluster", "slurm"], "--cluster slurm needs the variables srun sets, and SLURM_JOB_ID, SLURM_PROCID, "
                                   "SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST "
                                   "are not set"),
    ("torch", ["--cluster", "slurm"], "--cluster slurm needs the variables srun sets"),
    ("tf", ["--cluster", "kubernetes"], "--cluster kubernetes is not supported with --framework tf: on Kubernetes "
                                        "the training operator's TFJob sets TF_CONFIG"),
    ("torch", ["--cluster", "kubernetes"], "--cluster kubernetes is not supported with --framework torch"),
    ("torch", ["--cluster", "tf-config"], "--cluster tf-config is not supported with --framework torch"),
    ("tf", ["--cluster", "tf-config"], "--cluster tf-config needs TF_CONFIG, which is not set"),
    ("tf", ["--cluster", "slurm", "--strategy", "ps", "--model", "mlp"],
     "--cluster slurm is not supported with --strategy ps"),
    ("tf", ["--cluster", "pbs"], "cluster must be one of auto, kubernetes, slurm, tf-config, got 'pbs'"),
])
def test_a_cluster_that_cannot_be_read_is_refused_in_one_line(monkeypatch, capsys, tmp_path, framework, argv,
                                                               fragment):
    for key in [k for k in os.environ if k.startswith("SLURM_")] + list(RUNNERS):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "out"
    code = main(["train", "--framework", framework, "--dataset", "builtin:digits", "--replicas", "1", *argv,
                 "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def _two_slurm_tasks(tmp_path: Path, framework: str, *argv: str) -> Path:
    """Run ``evenflow train`` as the 2 tasks of a Slurm step on this host; the run directory."""
    job_id = random.randrange(1000, 9000)  # the job's ports: 20000 + job id
    base = {k: v for k, v in os.environ.items() if k not in RUNNERS and not k.startswith("SLURM_")}
    out = tmp_path / "run"
    cmd = ["timeout", "-k", "5", "240", sys.executable, "-m", "evenflow", "train", "--framework", framework,
           "--dataset", "builtin:digits", "--model", "mlp", "--epochs", "1", "--global-batch-size", "64",
           "--audit", "--output-dir", str(out), *argv]
    procs = [subprocess.Popen(cmd, env={**base, **slurm_env(r, job_id), "PYTHONPATH": str(SRC),
                                        "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for r in range(2)]
    results = [p.communicate(timeout=260) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-3000:]
    return out


def _audit(run: Path) -> str:
    proc = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-m", "evenflow", "audit", str(run)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_two_slurm_tasks_form_one_tensorflow_run_of_two_workers(tmp_path):
    pytest.importorskip("tensorflow")
    run = _two_slurm_tasks(tmp_path, "tf", "--replicas", "1")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["framework_info"]["strategy"] == "MultiWorkerMirroredStrategy"
    assert summary["replicas"] == 2, summary
    _audit(run)


def test_two_slurm_tasks_form_one_pytorch_run_of_two_ranks(tmp_path):
    pytest.importorskip("torch")
    run = _two_slurm_tasks(tmp_path, "torch")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas"] == 2, summary
    _audit(run)
