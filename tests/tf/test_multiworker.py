"""Several workers on localhost: MultiWorkerMirroredStrategy runs, a dead peer, accumulation and fp16 compression.

Every TensorFlow run is a real process (workers talk gRPC on 127.0.0.1) with a hard
timeout: on expiry the process and everything it started get SIGKILL, and the test
fails instead of hanging the suite.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evenflow.tf.launch.cluster import tf_config
from evenflow.tf.launch.local import free_ports
from tests._warm import warm_python

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_mw_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
for key in ("TF_CONFIG", "EVENFLOW_REPLICAS_PER_WORKER"):
    ENV.pop(key, None)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process it started (workers run in their own sessions)."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in [psutil.Process(proc.pid)] + family if proc.poll() is None else family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _run(cmd: list[str]) -> subprocess.Popen:
    """Start ``cmd``; the caller waits with :func:`_wait` (a hard timeout)."""
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen, timeout: float, what: str) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"{what} did not finish within {timeout} s (killed); stderr tail:\n{err[-3000:]}")
    return out, err


def _checkpoint_with_weights(run_dir: Path) -> bool:
    for meta in (run_dir / "checkpoints").glob("ckpt-*/meta.json"):
        try:
            if json.loads(meta.read_text()).get("weights"):
                return True
        except (OSError, ValueError):  # being written
            pass
    return False


def _weights(found: dict) -> list[np.ndarray]:
    return [found[k] for k in sorted((k for k in found if re.fullmatch(r"w\d+", k)), key=lambda k: int(k[1:]))]


def _load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_two_workers_train_like_one_worker_and_each_replica_reads_its_row(tmp_path):
    # 2 workers x 2 replicas through `evenflow launch`, against 1 worker x 2 replicas, run side by side.
    # N = 203 and G = 30 divide by neither 4 replicas nor each other: most steps carry padding, and
    # every replica must still run the same steps (an extra step on one worker would hang).
    spec = {"mode": "train", "replicas": 2, "n": 203, "classes": 5, "features": 6, "batch": 30, "epochs": 2,
            "seed": 3, "lr": 0.2, "eval_n": 37, "timeout": 60.0}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    warm = warm_python(ENV)  # the three processes start warm (tests/_warm.py)
    reference = _run([*warm, str(WORKER), str(spec_path), str(tmp_path / "ref.npz")])
    launcher = _run([sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--replicas-per-worker", "2",
                     "--", *warm, str(WORKER), str(spec_path), str(tmp_path / "mw_{worker}.npz")])
    try:
        out, err = _wait(launcher, 150, "evenflow launch of 2 workers")
        _, ref_err = _wait(reference, 150, "the 1-worker reference run")
    finally:
        if reference.poll() is None:
            _kill_tree(reference)
    assert launcher.returncode == 0, err[-4000:]
    assert reference.returncode == 0, ref_err[-4000:]
    assert "evenflow launch: 2 worker(s) on 127.0.0.1:" in err
    ref, workers = _load(tmp_path / "ref.npz"), [_load(tmp_path / f"mw_{w}.npz") for w in (0, 1)]
    assert [bool(w["chief"]) for w in workers] == [True, False]
    for w, found in enumerate(workers):
        # Worker w held global replicas 2w, 2w+1 and read exactly their rows of the plan, step by step.
        assert found["replica_ids"].tolist() == [2 * w, 2 * w + 1]
        planned = found["plan_ids"][:, :, found["replica_ids"], :]              # [epochs, steps, 2, slots]
        np.testing.assert_array_equal(found["seen"], planned.reshape(-1, *planned.shape[2:]))
        # The epoch figures are global (all-gathered), the same on both workers.
        assert found["epoch_samples"].tolist() == [203, 203]
        assert found["replica_samples"].sum(axis=1).tolist() == [203, 203]
        assert found["eval"][0] == 37  # every test sample counted once, over both workers
    np.testing.assert_array_equal(workers[0]["replica_samples"], workers[1]["replica_samples"])
    # No thread per collective (TensorFlow's own timeout starts one per op: +190 threads on this run).
    for found in workers:
        before, after = found["threads"].tolist()
        assert before < 0 or after - before < 40, (before, after)
    # Both workers hold bitwise the same weights (the all-reduce hands every replica the same sum) ...
    for a, b in zip(_weights(workers[0]), _weights(workers[1])):
        np.testing.assert_array_equal(a, b)
    # ... equal to the single worker's to float32 rounding, from the same initial weights.
    for k in (k for k in ref if k.startswith("init")):
        np.testing.assert_array_equal(workers[0][k], ref[k])
    moved = max(float(np.abs(w - ref[f"init{i}"]).max()) for i, w in enumerate(_weights(ref)))
    assert moved > 1e-2
    for i, (w, r) in enumerate(zip(_weights(workers[0]), _weights(ref))):
        np.testing.assert_allclose(w, r, rtol=2e-5, atol=2e-6, err_msg=f"weight {i}: 2 workers vs 1 worker")
    np.testing.assert_allclose(workers[0]["losses"], ref["losses"], rtol=1e-5)
    np.testing.assert_allclose(workers[0]["eval"], ref["eval"], rtol=1e-5)


def test_killing_one_of_two_workers_fails_the_other_fast_and_a_relaunch_resumes(tmp_path):
    # The real CLI, two workers with TF_CONFIG set by hand; fp16 compression and accumulation on, so
    # their collectives run between workers before the kill, and worker 1 emulated 2x slow, so the run
    # re-plans with measured weights before its first checkpoint. Worker 1 gets SIGKILL after its first
    # epoch; then both are relaunched with the same command, resume from the checkpoint with its
    # measured weights and finish, and the audit trail shows every sample exactly once per epoch.
    timeout = 20
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.normal(size=(256, 8)).astype(np.float32),
             y=rng.integers(0, 4, size=256))
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    cmd = [sys.executable, "-m", "evenflow", "train", "--dataset", str(tmp_path / "data.npz"), "--epochs", "40",
           "--replicas", "1", "--collective-timeout", str(timeout), "--gradient-compression", "fp16",
           "--accumulate-steps", "2", "--audit", "--simulate-slow", "1:2", "--simulate-sample-ms", "1",
           "--rebalance-payback", "0",
           "--output-dir", str(tmp_path / "run")]
    logs = [tmp_path / f"w{i}.err" for i in (0, 1)]
    procs = []
    try:
        for i in (0, 1):
            with open(logs[i], "w") as fh:
                procs.append(subprocess.Popen(cmd, env=dict(ENV, TF_CONFIG=tf_config(addresses, i)),
                                              stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True))
        deadline = time.monotonic() + 150
        while not _checkpoint_with_weights(tmp_path / "run"):  # re-planned, and saved with the new weights
            assert procs[0].poll() is None and procs[1].poll() is None, logs[0].read_text()[-3000:]
            if time.monotonic() > deadline:
                pytest.fail("no checkpoint with measured weights within 150 s:\n" + logs[1].read_text()[-3000:])
            time.sleep(0.1)
        os.killpg(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            procs[0].wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the surviving worker still ran {timeout + 30} s after its peer was killed")
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    err = logs[0].read_text()
    assert procs[0].returncode == 1, err[-3000:]
    assert waited < timeout + 15, f"survivor took {waited:.1f} s"
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("evenflow train: error: worker 0 of 2 lost the other workers ("), last
    # It names the newest checkpoint on disk (ckpt-EEEEE-SSSSSS), which the relaunch below resumes from.
    newest = sorted((tmp_path / "run" / "checkpoints").glob("ckpt-*"))[-1]
    epoch, step = int(newest.name[5:10]), int(newest.name[11:])
    assert last.endswith(f". Check the other workers' output, then rerun the same command on every worker to resume "
                         f"from {newest} (epoch {epoch} step {step})"), last

    # Relaunch both workers with the same command: they resume and finish.
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    try:
        for i in (0, 1):
            with open(tmp_path / f"r{i}.err", "w") as fh, open(tmp_path / f"r{i}.out", "w") as out:
                procs.append(subprocess.Popen(cmd, env=dict(ENV, TF_CONFIG=tf_config(addresses, i)),
                                              stdout=out, stderr=fh, start_new_session=True))
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=180)
            except subprocess.TimeoutExpired:
                pytest.fail(f"relaunched worker {i} did not finish within 180 s:\n"
                            + (tmp_path / f"r{i}.err").read_text()[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for i, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"r{i}.err").read_text()[-3000:]
    resumed = (tmp_path / "r0.err").read_text()
    # It started from the checkpoint, not from epoch 1, and ran to the end.
    assert not re.search(r"epoch +0 \( *1/40\)", resumed) and re.search(r"epoch +39 \(40/40\)", resumed), \
        resumed[-3000:]
    # ... with the weights measured before the kill (the global replica count). Worker 0 says so; worker 1 is
    # quiet without --verbose, and the workers' agreement on one plan (weights included) holds before any step.
    text = (tmp_path / "r0.out").read_text()
    assert re.search(r"resuming with the measured replica weights [0-9.]+, [0-9.]+\n", text), text[:2000]
    assert (tmp_path / "r1.out").read_text() == ""
    audit = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(tmp_path / "run")], env=ENV,
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "exactly once" in audit.stdout, audit.stdout


def test_a_peer_that_stays_alive_but_stops_taking_part_ends_the_run_after_the_collective_timeout(tmp_path):
    # Worker 1's replica is emulated 100x slow from step 3 (a 32 s step, alive and heartbeating), so
    # worker 0's update waits in its collectives: past --collective-timeout the watchdog aborts them and
    # worker 0 stops with the one-line error. Threads stay few: no thread per collective. The timeout is
    # also the workers' start-up deadline: 20 s lets one start that much later on a busy machine.
    timeout = 20
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    cmd = [sys.executable, "-m", "evenflow", "train", "--dataset", "builtin:digits", "--epochs", "2",
           "--replicas", "1", "--rebalance", "off", "--simulate-slow", "1:100@3", "--simulate-sample-ms", "10",
           "--collective-timeout", str(timeout), "--output-dir", str(tmp_path / "run")]
    procs = [subprocess.Popen(["timeout", "-k", "5", "150", *cmd], env=dict(ENV, TF_CONFIG=tf_config(addresses, i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    errs = [_wait(p, 170, f"worker {i}")[1] for i, p in enumerate(procs)]
    assert procs[0].returncode == 1, errs[0][-3000:]
    assert "Traceback" not in errs[0]
    last = errs[0].strip().splitlines()[-1]
    assert last.startswith("evenflow train: error: worker 0 of 2 lost the other workers (DeadlineExceededError: "
                           f"Collective has timed out during execution: a call waited more than {timeout} s"), last
    assert procs[1].returncode == 1, errs[1][-3000:]


def test_accumulated_and_fp16_updates_equal_one_update_on_the_union(tmp_path):
    # N = 29, G = 8: steps of 8, 8, 8 and 5 real samples on 2 replicas; k = 2 groups them (8, 8) and
    # (8, 5). Each SGD update must be -lr * grad(mean loss over the group's real samples): the second
    # group weighs its 13 samples equally, which averaging the two step means (Keras's
    # gradient_accumulation_steps) would not. fp16 compression: the same to float16 rounding.
    spec = {"mode": "accumulate", "n": 29, "classes": 3, "features": 5, "batch": 8, "seed": 1, "lr": 1.0, "k": 2}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = _run([*warm_python(ENV), str(WORKER), str(spec_path), str(tmp_path / "acc.npz")])
    _, err = _wait(proc, 150, "the accumulation run")
    assert proc.returncode == 0, err[-4000:]
    found = _load(tmp_path / "acc.npz")
    assert found["global_real_counts"].tolist() == [8, 8, 8, 5]
    for tag, rtol in (("acc", 1e-5), ("fp16", 3e-3)):
        assert found[f"{tag}_cursors"].tolist() == [2, 4]  # on_step sees group boundaries only
        assert int(found[f"{tag}_iterations"]) == 2        # one optimizer update per group
        assert [int(found[f"{tag}_g{g}_count"]) for g in (0, 1)] == [16, 13]
        for g in (0, 1):
            n = sum(1 for k in found if k.startswith(f"{tag}_g{g}_delta"))
            assert n == 6
            for i in range(n):
                expect = found[f"{tag}_g{g}_expect{i}"]
                np.testing.assert_allclose(found[f"{tag}_g{g}_delta{i}"], expect, rtol=rtol,
                                           atol=rtol * float(np.abs(expect).max()),
                                           err_msg=f"{tag}: group {g}, weight {i}")
