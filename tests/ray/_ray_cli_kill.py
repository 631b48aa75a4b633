"""Drive ``evenflow train --engine ray`` on the test cluster: SIGKILL a Ray Train worker once the run has written
its first checkpoint past the start, let Ray restart the group, then ``evenflow audit`` the run directory."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.ray.conftest import RAY_ENV


def _started_here(pid: int) -> bool:
    """Whether ``pid`` descends from this process (the test's Ray cluster: its raylet starts the workers)."""
    while pid > 1:
        if pid == os.getpid():
            return True
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent, after the (title)
    return False


def ray_workers() -> list[int]:
    """The processes of Ray Train's workers (their title is ``ray::RayTrainWorker...``) of this test's cluster,
    not of another Ray cluster on the machine."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::RayTrainWorker") \
                    and _started_here(int(proc.name)):
                pids.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(pids)


def written_since(folder: Path, t: float) -> bool:
    """Whether a checkpoint file in ``folder`` was written after time ``t``."""
    for path in folder.glob("ckpt-*/*"):
        try:
            if path.stat().st_mtime > t:
                return True
        except FileNotFoundError:  # an older checkpoint removed meanwhile (--keep-checkpoints)
            continue
    return False


def train_killing_a_worker(train_args: list[str], out: Path, tmp_path: Path, what: str) -> dict:
    """Run ``evenflow train <train_args> --output-dir out``, kill a worker after the first checkpoint past the
    start, wait for the run to end (exit 0 asserted); returns ``evenflow audit out --json``'s report.

    The deadlines are hang guards, not timings: a run that takes 40-90 s alone took 145-220 s on a 2-core
    machine busy with other work (the suite's parallel pass shares it), so each allows several times that."""
    cmd = ["timeout", "-k", "5", "480", sys.executable, "-m", "evenflow", "train", *train_args, "--output-dir", str(out)]
    env = {**os.environ, **RAY_ENV}
    log_path = tmp_path / "cli.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            end = time.monotonic() + 300
            while not [p for p in (out / "checkpoints").glob("ckpt-*") if p.name != "ckpt-00000-000000"]:
                assert proc.poll() is None and time.monotonic() < end, log_path.read_text()[-3000:]
                time.sleep(0.2)
            workers = ray_workers()
            assert len(workers) == 2, workers
            os.kill(workers[-1], signal.SIGKILL)
            killed = time.time()
            while proc.poll() is None and not written_since(out / "checkpoints", killed):
                time.sleep(0.1)
            print(f"\n{what}: worker killed -> the restarted group's first checkpoint {time.time() - killed:.1f} s")
            assert proc.wait(timeout=420) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    audit = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-m", "evenflow", "audit", str(out), "--json"],
                           capture_output=True, text=True, env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    return json.loads(audit.stdout)
