"""Crash, elastic-restart and poisoned-data scenarios of ``evenflow train``, run from one warm process.

    python _fault_driver.py WORK_DIR OUT.json SEED

Starting TensorFlow costs 10-25 s per process on the 2-core test machine, and the
crash scenario needs a dozen processes. So this driver imports TensorFlow once
(without starting its runtime: no op runs in this process until every child is
done) and ``fork``s each training process from itself: every child is a separate
process that runs the real CLI entry point (``evenflow.cli.main(["train", ...])``,
the same argv each time), configures its own devices, and is killed with a real
SIGKILL. The uninterrupted reference run is such a child too.

Scenarios (results to OUT.json, no pickle; the test asserts on them):

* ``crash``: one run directory, a training process killed at 12 random points —
  inside checkpoint saves (``EVENFLOW_FAULT=kill:save-<phase>:n``), after a random
  number of steps (``kill:step:n``) and by an external ``kill -9`` at a random moment
  after the run has made progress — then the same command once more to the end;
* ``elastic``: 2 replicas killed mid-epoch, resumed with 3;
* ``poison``: NaN features in a few samples (one isolated, three in consecutive steps);
* ``diverge``: SGD with a learning rate of 1000, which blows the weights up.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402,F401  (warm imports shared by the forked children; no TF runtime yet)
import tensorflow  # noqa: E402,F401

import evenflow as ef  # noqa: E402
import evenflow.run.guard  # noqa: E402,F401
import evenflow.run.job  # noqa: E402,F401
import evenflow.tf.trainer  # noqa: E402,F401
from evenflow.cli import main  # noqa: E402
from evenflow.run.audit import check_audit  # noqa: E402
from evenflow.run.checkpoints import list_checkpoints  # noqa: E402
from evenflow.data import split_indices  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
CHILD_TIMEOUT = 90.0
SEED = 3  # the training seed of every scenario (plan order and weight initialisation)


def dataset(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)).astype(np.int64)
    np.savez(path, x=x, y=y)
    return x, y


def spawn(argv: list[str], env: dict, log: Path) -> int:
    """Fork a child that runs ``evenflow <argv>`` with ``env`` added; returns its pid."""
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 99
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(env)
            code = main(argv)
        except BaseException:  # noqa: BLE001 - report anything, then leave without cleanup
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def wait(pid: int, timeout: float = CHILD_TIMEOUT, until=None) -> tuple[str, int]:
    """Wait for ``pid``; ("exit", code) or ("signal", n). ``until()`` True -> returns ("ready", 0) early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return ("signal", os.WTERMSIG(status)) if os.WIFSIGNALED(status) else ("exit", os.WEXITSTATUS(status))
        if until is not None and until():
            return "ready", 0
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise RuntimeError(f"child {pid} did not finish within {timeout} s (killed)")


def latest(run_dir: Path):
    found = list_checkpoints(run_dir)
    return found[-1].cursor if found else None


def run_to_end(argv, log, env=None) -> None:
    kind, code = wait(spawn(argv, env or {}, log))
    if (kind, code) != ("exit", 0):
        raise RuntimeError(f"evenflow {' '.join(argv)} ended with {kind} {code}; log:\n{log.read_text()[-3000:]}")


def crash(work: Path, rng: random.Random, common: list[str]) -> dict:
    run_dir = work / "crash"
    argv = ["train", *common, "--output-dir", str(run_dir)]
    plan = [("hook", "kill:save-written:1")]  # the first save of all: the untrained model's checkpoint
    plan += [("hook", f"kill:save-{phase}:{rng.randint(1, 3)}") for phase in ("begin", "written", "synced", "renamed")]
    plan += [("hook", f"kill:step:{rng.randint(1, 8)}") for _ in range(2)]
    plan += [("time", rng.uniform(0.0, 0.1)) for _ in range(3)]
    first, rest = plan[0], plan[1:]
    rng.shuffle(rest)
    kills = []
    for i, (kind, arg) in enumerate([first, *rest]):
        before = latest(run_dir)
        log = work / f"crash-{i:02d}.log"
        if kind == "hook":
            pid = spawn(argv, {"EVENFLOW_FAULT": arg}, log)
            how, code = wait(pid)
        else:
            # Slow saves and steps a little, so a kill at a random moment often lands inside a save.
            pid = spawn(argv, {"EVENFLOW_FAULT": "sleep:save-written:0.03,sleep:step:0.01"}, log)
            how, code = wait(pid, until=lambda: latest(run_dir) not in (None, before))
            if how == "ready":
                time.sleep(arg)
                os.kill(pid, signal.SIGKILL)
                how, code = wait(pid)
        after = latest(run_dir)
        leftovers = sorted(p.name for p in (run_dir / "checkpoints").glob(".tmp-*")) if run_dir.exists() else []
        kills.append({"kind": kind, "arg": arg, "ended": [how, code], "before": before and before.to_dict(),
                      "after": after and after.to_dict(), "tmp_left": leftovers})
        if how == "exit":
            break  # the run finished before this kill: fewer kills (the test checks the count)
    run_to_end(argv, work / "crash-final.log")
    final = (work / "crash-final.log").read_text()
    return {"kills": kills, "final_resumed": "resuming from" in final, "final_log": final[-2000:]}


def elastic(work: Path, rng: random.Random, common: list[str], steps_per_epoch: int) -> dict:
    run_dir = work / "elastic"
    base = ["train", *[a for a in common], "--output-dir", str(run_dir)]
    # Kill after a step count that lands in the middle of the second epoch (epoch-end saves count).
    kill_at = steps_per_epoch + rng.randint(3, steps_per_epoch - 3)
    kind, code = wait(spawn([*base, "--replicas", "2"], {"EVENFLOW_FAULT": f"kill:step:{kill_at}"},
                            work / "elastic-a.log"))
    cut = latest(run_dir)
    run_to_end([*base, "--replicas", "3"], work / "elastic-b.log")
    return {"first": [kind, code], "cut": cut and cut.to_dict()}


def poison(work: Path, common: list[str], batch: int) -> dict:
    path = work / "poison.npz"
    x, y = dataset(path, 300, seed=5)
    train, _ = split_indices(y, 0.2, 0)
    index = ef.Index(len(train), labels=y[train])
    plan = ef.Plan(index, ef.Topology(2), global_batch_size=batch, seed=SEED, stratify=True)
    ep0, ep1 = plan.epoch(0), plan.epoch(1)

    def bad_steps(ep, bad):
        return sorted(int(s) for s in range(ep.num_steps) if np.isin(ep.ids[s], bad).any())

    # One isolated bad step (1) and a streak of three (4, 5, 6) in epoch 0; choose the samples so
    # that epoch 1 has no streak of three (its restores would then be another story).
    for slot in range(plan.slots):
        bad = [int(ep0.ids[1, 0, slot])] + [int(ep0.ids[s, 1, slot]) for s in (4, 5, 6)]
        e1 = bad_steps(ep1, bad)
        if not any(s + 1 in e1 and s + 2 in e1 for s in e1):
            break
    x[train[bad]] = np.nan
    np.savez(path, x=x, y=y)
    run_dir = work / "poison"
    argv = ["train", *common, "--dataset", str(path), "--replicas", "2", "--epochs", "2",
            "--restore-after", "3", "--restore-lr-factor", "0.5", "--output-dir", str(run_dir)]
    run_to_end(argv, work / "poison.log")
    events = [json.loads(line) for line in (run_dir / "anomalies.jsonl").read_text().splitlines()]
    plan_ids = {(e, s): np.sort(ep.ids[s][ep.ids[s] >= 0]).tolist()
                for e, ep in ((0, ep0), (1, ep1)) for s in range(ep.num_steps)}
    return {"bad_ids": bad, "expected": {"0": bad_steps(ep0, bad), "1": bad_steps(ep1, bad)},
            "events": events, "plan_ids": {f"{e}-{s}": v for (e, s), v in plan_ids.items()},
            "summary": json.loads((run_dir / "summary.json").read_text())}


def diverge(work: Path, common: list[str]) -> dict:
    """Plain SGD at a learning rate of 1000 blows the weights up: restore, lower the rate 1000x, go on."""
    run_dir = work / "diverge"
    argv = ["train", *common, "--optimizer", "sgd", "--learning-rate", "1000", "--restore-lr-factor", "0.001",
            "--epochs", "1", "--replicas", "1", "--no-audit", "--output-dir", str(run_dir)]
    run_to_end(argv, work / "diverge.log")
    events = [json.loads(line) for line in (run_dir / "anomalies.jsonl").read_text().splitlines()]
    return {"events": events, "summary": json.loads((run_dir / "summary.json").read_text())}


def finite_checkpoints(run_dir: Path) -> dict:
    import tensorflow as tf

    out = {}
    for info in list_checkpoints(run_dir):
        reader = tf.train.load_checkpoint(str(info.path / "state"))
        names = [k for k in reader.get_variable_to_shape_map() if "VARIABLE_VALUE" in k]
        out[info.path.name] = all(np.isfinite(reader.get_tensor(k)).all() for k in names
                                  if np.issubdtype(reader.get_tensor(k).dtype, np.floating))
    return out


def final_state(run_dir: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf

    info = list_checkpoints(run_dir)[-1]
    reader = tf.train.load_checkpoint(str(info.path / "state"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "VARIABLE_VALUE" in k}


def audit_cli(run_dir: Path) -> list:
    proc = subprocess.run([sys.executable, "-c", "import sys; from evenflow.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "audit", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(SRC)))
    return [proc.returncode, proc.stdout]


def nonfinite_model_is_refused(work: Path) -> dict:
    """Checkpointer.save on a model holding NaN raises and writes nothing."""
    import keras

    from evenflow.run.checkpoints import Checkpointer, NonFiniteModelError
    from evenflow.tf.state import TFState

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    kernel = model.trainable_variables[0]
    kernel.assign(np.full(kernel.shape, np.nan, np.float32))
    ckpt = Checkpointer(work / "nan", TFState(model, opt))
    try:
        ckpt.save(ef.Cursor(0, 1))
        refused = False
    except NonFiniteModelError:
        refused = True
    return {"refused": refused, "written": sorted(p.name for p in (work / "nan").rglob("*"))}


def main_driver(work: Path, out: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = work / "data.npz"
    dataset(data, 300, seed=1)  # 240 training samples
    batch, epochs = 16, 4  # 15 steps per epoch: room for 10 kills of a few steps' progress each
    common = ["--dataset", str(data), "--model", "mlp", "--optimizer", "adam", "--learning-rate", "0.01",
              "--global-batch-size", str(batch), "--epochs", str(epochs), "--seed", str(SEED),
              "--checkpoint-every", "2", "--keep-checkpoints", "2", "--deterministic", "--audit"]
    result = {"seed": seed, "seconds": {}}
    t0 = time.monotonic()
    run_to_end(["train", *common, "--replicas", "1", "--output-dir", str(work / "reference")], work / "reference.log")
    result["seconds"]["reference"] = time.monotonic() - t0
    t0 = time.monotonic()
    result["crash"] = crash(work, rng, [*common, "--replicas", "1"])
    result["seconds"]["crash"] = time.monotonic() - t0
    t0 = time.monotonic()
    result["elastic"] = elastic(work, rng, common, steps_per_epoch=15)
    result["seconds"]["elastic"] = time.monotonic() - t0
    t0 = time.monotonic()
    result["poison"] = poison(work, [a for a in common if a not in ("--deterministic",)], batch)
    result["seconds"]["poison"] = time.monotonic() - t0
    t0 = time.monotonic()
    result["diverge"] = diverge(work, [a for a in common if a not in ("--deterministic",)])
    result["seconds"]["diverge"] = time.monotonic() - t0
    # Every fork is done: TensorFlow's runtime may start in this process now.
    ref = final_state(work / "reference")
    got = final_state(work / "crash")
    result["bitwise_equal"] = sorted(ref) == sorted(got) and all(np.array_equal(ref[k], got[k]) for k in ref)
    result["num_variables"] = len(ref)
    el = final_state(work / "elastic")
    result["elastic_max_abs_diff"] = max(float(np.abs(el[k].astype(np.float64) - ref[k]).max()) for k in ref)
    result["audit"] = {name: [e.to_dict() for e in check_audit(work / name)]
                       for name in ("crash", "elastic", "poison", "reference")}
    result["audit_cli"] = audit_cli(work / "crash")
    result["finite"] = {name: finite_checkpoints(work / name) for name in ("crash", "poison", "diverge")}
    result["summaries"] = {name: json.loads((work / name / "summary.json").read_text())
                           for name in ("crash", "elastic", "reference")}
    result["nan_model"] = nonfinite_model_is_refused(work)
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main_driver(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
    sys.stdout.flush()
    os._exit(0)
