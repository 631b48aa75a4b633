"""Every ``evenflow train`` option x {tf, torch}: honoured, with its effect checked, or refused with exit 2.

A handful of real runs (TensorFlow in fresh processes, PyTorch as 2 gloo ranks on 127.0.0.1)
set nearly every option away from its default at once; each row of :data:`TABLE` then checks
that option's effect on the run's outputs (summary, telemetry, audit, checkpoints, logs) or,
for a framework that cannot honour it, that it is refused with one line naming it. A new
option without a row fails :func:`test_the_table_has_a_row_for_every_option`. The options
whose effect is timed (re-plans from measured speeds, the emulated slowdown) are checked on two
runs of their own, each alone (``timed_runs``, the suite's serial pass); the other runs check
nothing timed and run two at a time (``runs``, the parallel pass; tests/conftest.py).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main
from evenflow.data import split_indices
from evenflow.run.config import KEYS

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")
pytest.importorskip("torch")

from tests._warm import warm_python  # noqa: E402
from tests.torch.conftest import run_ranks  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
N, G, SEED, SPLIT_SEED, FRACTION, EVAL_N = 240, 30, 5, 1, 0.25, 37
# Options set away from their defaults in both frameworks' main runs.
COMMON = ["--feature-key", "feat", "--label-key", "lab", "--test-fraction", str(FRACTION), "--split-seed",
          str(SPLIT_SEED), "--augment", "flip", "--model", "cnn", "--dropout", "0.2", "--optimizer", "sgd",
          "--learning-rate", "0.05", "--epochs", "2", "--global-batch-size", str(G), "--seed", str(SEED),
          "--no-stratify", "--balance", "cost", "--bucket", "--replicas", "2", "--precision", "mixed_bfloat16",
          "--threads", "1", "--gradient-compression", "fp16", "--accumulate-steps", "2", "--checkpoint-every", "2",
          "--keep-checkpoints", "1", "--audit", "--deterministic", "--rebalance", "on", "--rebalance-threshold",
          "1.05", "--rebalance-payback", "0", "--simulate-slow", "1:3@4", "--simulate-sample-ms", "0.5"]


@dataclass
class Run:
    """One ``evenflow train`` run: exit code, output of process 0, its run directory."""

    code: int
    out: str
    err: str
    dir: Path
    labels: np.ndarray | None = None

    @property
    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    @property
    def info(self) -> dict:
        return self.summary["framework_info"]

    def telemetry(self, kind: str) -> list[dict]:
        lines = (self.dir / "telemetry.jsonl").read_text().splitlines()
        return [x for x in map(json.loads, lines) if x["kind"] == kind]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")


def _python(framework: str, warm: bool) -> list[str]:
    """The interpreter of a run's processes: ``warm`` ones fork from a process that has imported the framework
    (tests/_warm.py; not for --verbose, which sets the frameworks' log levels before their import)."""
    return warm_python(_env(), framework) if warm else [sys.executable]


def _tf(root: Path, name: str, *argv: str, launch: bool = False, warm: bool = False) -> Run:
    cmd = [*_python("tensorflow", warm), "-m", "evenflow", "train", "--framework", "tf", *argv, "--output-dir",
           str(root / name)]
    if launch:
        cmd = [sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--replicas-per-worker", "1", "--", *cmd]
    proc = subprocess.run(["timeout", "-k", "5", "240", *cmd], capture_output=True, text=True, env=_env(), cwd=root)
    return Run(proc.returncode, proc.stdout, proc.stderr, root / name)


def _torch(root: Path, name: str, *argv: str, world: int = 2, warm: bool = False) -> Run:
    cmd = [*_python("torch", warm), "-m", "evenflow", "train", "--framework", "torch", *argv, "--output-dir",
           str(root / name)]
    if world == 1:
        proc = subprocess.run(["timeout", "-k", "5", "240", *cmd], capture_output=True, text=True, env=_env(),
                              cwd=root)
        return Run(proc.returncode, proc.stdout, proc.stderr, root / name)
    out = root / f"{name}.out"

    def argv_of(rank):  # rank 0's stdout kept in a file: run_ranks keeps stderr only
        return ["sh", "-c", " ".join(f"'{a}'" for a in cmd) + (f" > '{out}'" if rank == 0 else " > /dev/null")]

    ranks = run_ranks([(argv_of, world, lambda r: None)], timeout=240)[0]
    code = max((r.returncode for r in ranks), key=abs)
    return Run(code, out.read_text() if out.exists() else "", ranks[0].stderr, root / name)


def _data(root: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """Records of 8x8 features with a label and a cost column (for cost balancing and buckets), and NaN arrays."""
    from evenflow.data import convert

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, N)
    x = rng.normal(size=(N, 8, 8)).astype(np.float32) + y[:, None, None]
    cost = rng.integers(1, 50, N).astype(np.float64)
    np.savez(root / "d.npz", feat=x, lab=y, c=cost)
    convert(str(root / "d.npz"), root / "rec", shards=2, label_key="lab", cost_key="c")
    bad = x.copy()
    bad[[3, 50, 51]] = np.nan
    np.savez(root / "nan.npz", x=bad, y=y)
    np.savez(root / "eval.npz", feat=x[:EVAL_N] * 0.9, lab=y[:EVAL_N])  # read with the records' keys feat / lab
    digits_x = np.random.default_rng(1).random((EVAL_N, 8, 8, 1)).astype(np.float32)
    np.savez(root / "digits_eval.npz", x=digits_x, y=np.arange(EVAL_N) % 10)  # builtin:digits' shape
    return root / "rec", y, cost


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags")
    data, labels, costs = _data(root)
    (root / "run.toml").write_text(f'dataset = "{root / "nan.npz"}"\nepochs = 1\nreplicas = 1\n')
    return {"root": root, "data": data, "labels": labels, "costs": costs}


@pytest.fixture(scope="module")
def timed_runs(inputs):
    """The runs whose checks rest on measured speeds (re-plans, the emulated slowdown), one at a time.

    Long enough for a re-plan to take effect: the TensorFlow pipelines switch plans at the first step
    they have not read (their prefetch buffers ahead of the decision), past a 2-epoch run's 12 steps.
    Count balance: the emulated device time is per sample (--simulate-sample-ms), and this data's costs
    are random numbers, so in cost units a replica's time looks like a fixed part that no move of cost
    would shorten, and whether a re-plan comes depends on the first check's noise.
    """
    root, data = inputs["root"], str(inputs["data"])
    long = (*COMMON, "--epochs", "4", "--balance", "count")
    r = {"tf": _tf(root, "tf_long", "--dataset", data, *long),
         "torch": _torch(root, "torch_long", "--dataset", data, *long, "--backend", "gloo")}
    for name, run in r.items():
        assert run.code == 0, f"{name}_long failed:\n{run.err[-3000:]}"
    return r


@pytest.fixture(scope="module")
def runs(inputs):
    """The runs that check nothing timed: two lanes at once, each a chain of runs; every run of several
    processes (which picks free ports) is in lane `several`, beside the single processes of lane `one`. All but
    the two main runs (--verbose) start warm (tests/_warm.py)."""
    r = dict(inputs)
    root, data = r["root"], str(r["data"])
    nan = ("--config", str(root / "run.toml"), "--no-telemetry", "--restore-after", "2", "--restore-lr-factor", "0.25",
           "--max-restores", "5")

    def main_tf():  # resumed below from a copy
        run = _tf(root, "tf", "--dataset", data, *COMMON, "--verbose")
        if run.code == 0:
            shutil.copytree(root / "tf", root / "tf_resumed")
        return run

    def main_torch():  # started over below from a copy (--no-resume)
        run = _torch(root, "torch", "--dataset", data, *COMMON, "--backend", "gloo", "--loader-workers", "2",
                     "--bytes-per-pack", "65536", "--collective-timeout", "60", "--verbose")
        if run.code == 0:
            shutil.copytree(root / "torch", root / "torch_fresh")
        return run

    several = {
        "torch": main_torch,
        "tf_workers": lambda: _tf(root, "tf_workers", "--dataset", "builtin:digits", "--epochs", "1", "--communication",
                                  "ring", "--bytes-per-pack", "65536", "--collective-timeout", "60", "--eval-dataset",
                                  str(root / "digits_eval.npz"), launch=True, warm=True),
        "torch_fresh": lambda: _torch(root, "torch_fresh", "--dataset", data, *COMMON, "--backend", "gloo",
                                      "--no-resume", "--epochs", "1", "--test-fraction", "0", "--split-seed", "0",
                                      "--eval-dataset", str(root / "eval.npz"), warm=True),
        "torch_sharded": lambda: _torch(root, "torch_sharded", "--dataset", data, "--feature-key", "feat",
                                        "--label-key", "lab", "--replicas", "2", "--shard-parameters", "--epochs", "2",
                                        "--accumulate-steps", "2", "--checkpoint-every", "2", "--audit", "--precision",
                                        "mixed_bfloat16", warm=True),
        "torch_nan": lambda: _torch(root, "torch_nan", *nan, world=1, warm=True),
        "torch_apply_nan": lambda: _torch(root, "torch_apply", "--config", str(root / "run.toml"),
                                          "--no-skip-nonfinite", world=1, warm=True),
        "skip_torch": lambda: _skip_corrupt_run("torch", root, warm=True),
    }
    one = {
        "tf": main_tf,
        "tf_nan": lambda: _tf(root, "tf_nan", *nan, "--communication", "ring", warm=True),
        "tf_apply_nan": lambda: _tf(root, "tf_apply", "--config", str(root / "run.toml"), "--no-skip-nonfinite",
                                    warm=True),
        "tf_resume": lambda: _tf(root, "tf_resumed", "--dataset", data, *COMMON, "--epochs", "3", warm=True),
        "skip_tf": lambda: _skip_corrupt_run("tf", root, warm=True),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(lambda lane: {name: run() for name, run in lane.items()}, lane) for lane in (several, one)]
        for lane in lanes:
            r.update(lane.result())
    for name in ("tf", "tf_resume", "tf_nan", "tf_workers", "torch", "torch_fresh", "torch_sharded", "torch_nan",
                 "skip_tf", "skip_torch"):
        assert r[name].code == 0, f"{name} failed:\n{r[name].err[-3000:]}"
    return r


def _refused(framework: str, fragment: str, *argv: str) -> str:
    """Exit 2 with one line naming the flag and the framework; nothing written."""
    return f"refused:{fragment}", (framework, argv)


# -- checks -----------------------------------------------------------------------------------------
def _expected_plan(r) -> ef.Plan:
    train, _ = split_indices(r["labels"], FRACTION, SPLIT_SEED)
    index = ef.Index(len(train), labels=r["labels"][train], costs=r["costs"][train])
    return ef.Plan(index, ef.Topology(2), global_batch_size=G, seed=SEED, stratify=False, balance="cost",
                   bucket=True)


def _audit_steps(run: Run, epoch: int) -> dict[int, np.ndarray]:
    """step -> ids [replicas, slots] the run's audit recorded for ``epoch``."""
    rows: dict[int, dict[int, np.ndarray]] = {}
    for path in sorted((run.dir / "audit").glob(f"e{epoch:05d}-*.npz")):
        with np.load(path) as z:
            for k, step in enumerate(z["steps"].tolist()):
                for j, replica in enumerate(z["replicas"].tolist()):
                    rows.setdefault(step, {})[replica] = z["ids"][k][j]
    return {s: [rows[s][r] for r in sorted(rows[s])] for s in sorted(rows)}


def check_plan_options(r, run: Run) -> None:
    """seed, global_batch_size, stratify, bucket: every step's set of ids is the expected plan's."""
    plan = _expected_plan(r)
    for epoch in range(2):
        steps = _audit_steps(run, epoch)
        assert len(steps) == plan.num_steps
        for s, rows in steps.items():
            got = np.sort(np.concatenate([row[row >= 0] for row in rows]))
            np.testing.assert_array_equal(got, plan.epoch(epoch).step_ids(s))


def check_balance(r, run: Run) -> None:
    """balance cost: step 0's split among the replicas (before any re-plan) is the cost plan's."""
    ids = _expected_plan(r).epoch(0).ids[0]
    rows = _audit_steps(run, 0)[0]
    for replica, row in enumerate(rows):
        assert sorted(row[row >= 0].tolist()) == sorted(ids[replica][ids[replica] >= 0].tolist())


def check_split(r, run: Run) -> None:
    train, test = split_indices(r["labels"], FRACTION, SPLIT_SEED)
    split = run.summary["split"]
    assert split["test"] == run.summary["test_samples"] == len(test)
    assert split["test_digest"] == hashlib.sha256(np.sort(test).astype(np.int64).tobytes()).hexdigest()[:16]
    _, other = split_indices(r["labels"], FRACTION, 0)
    assert not np.array_equal(np.sort(other), np.sort(test))  # another split seed holds out other samples


def check_checkpoints(run: Run) -> None:
    """checkpoint_every 2: audit segments (flushed with each checkpoint) span 2 steps; keep 1 (+ the confirmed one)."""
    names = [p.name.split("-") for p in (run.dir / "audit").glob("e00000-*-w000.npz")]  # e00000-s000002-000003-w000
    spans = {int(last) - int(first[1:]) + 1 for _, first, last, _ in names}
    assert spans <= {1, 2} and 2 in spans
    assert 1 <= len(list((run.dir / "checkpoints").glob("ckpt-*"))) <= 2


def check_accumulate(run: Run) -> None:
    """accumulate_steps 2: one update (one telemetry line) per 2 plan steps."""
    per_epoch = {}
    for line in run.telemetry("step"):
        per_epoch[line["epoch"]] = per_epoch.get(line["epoch"], 0) + 1
    plan_steps = run.summary["plan"]["num_steps"]
    assert per_epoch[0] == math.ceil(plan_steps / 2), (per_epoch, plan_steps)


def check_simulation(run: Run) -> None:
    """simulate_slow 1:3@4 and simulate_sample_ms 0.5: replica 1 computes ~3x longer from step 4, all >= 0.5 ms/sample."""
    lines = run.telemetry("step")
    for x in lines:
        for samples, compute in zip(x["samples"], x["compute"]):
            assert compute >= 0.0005 * samples * 0.95
    per_epoch = run.telemetry("run")[0]["steps_per_epoch"]
    # Per sample, so a re-plan that gives replica 1 fewer samples does not hide its slowdown. An
    # update's line names its last plan step; the updates of plan steps 4 and 5 on are slowed.
    def ratio(x):
        (c0, c1), (n0, n1) = x["compute"][:2], x["samples"][:2]
        return (c1 / max(n1, 1)) / max(c0 / max(n0, 1), 1e-9)

    slow = [ratio(x) for x in lines if x["epoch"] * per_epoch + x["step"] >= 5 and min(x["samples"][:2]) > 0]
    fast = [ratio(x) for x in lines if x["epoch"] * per_epoch + x["step"] < 4 and min(x["samples"][:2]) > 0]
    # Against the fastest update before the slowdown: of its two updates, the run's first includes the
    # warm-up, which a busy machine can stretch on one rank only (measured: 3.5x once, under load).
    assert slow and fast and np.median(slow) > 1.8 * min(fast), (slow, fast)


def check_rebalance(run: Run) -> None:
    """rebalance on, threshold 1.05 (the default is 1.10), payback 0: at least one re-plan, each predicted
    to make the whole step (the overhead outside the replicas' compute included) more than 1.05x faster."""
    events = run.telemetry("rebalance")
    assert events and all(e["gain"] > 1.05 for e in events if e["reason"] == "replan"), events
    assert events[0]["after"][1] < 0.7  # the slow replica gets less


def check_anomaly_policy(run: Run) -> None:  # noqa: C901
    """skip_nonfinite (default), restore_after 2, restore_lr_factor 0.25, max_restores 5: NaN steps skipped and logged."""
    events = [json.loads(x) for x in (run.dir / "anomalies.jsonl").read_text().splitlines()]
    nonfinite = [e for e in events if e["event"] == "nonfinite"]
    assert nonfinite and all(e["skipped"] for e in nonfinite)
    train, _ = split_indices(run.labels, 0.2, 0)  # the log names training-set positions
    assert {int(train[i]) for e in nonfinite for i in e["suspects"]} <= {3, 50, 51}
    assert {int(train[i]) for e in nonfinite for i in e["suspects"]}
    for e in (e for e in events if e["event"] == "restored"):
        old, new = e["learning_rate"]
        assert new == pytest.approx(old * 0.25)
        assert e["restores"] <= 5
    restored = [e for e in events if e["event"] == "restored"]
    streaks = [e["streak"] for e in nonfinite if not e["replay"]]
    assert bool(restored) == (max(streaks) >= 2)


def check_applied_nan(run: Run) -> None:
    """--no-skip-nonfinite: the NaN update is applied, and the run stops when it would checkpoint a NaN model."""
    assert run.code == 2 and "holds NaN or Inf" in run.err.strip().splitlines()[-1]


def check_verbose(framework: str, run: Run) -> None:
    if framework == "tf":
        assert "absl::InitializeLog" in run.err or "port.cc" in run.err  # TensorFlow's own start-up lines
    else:
        assert "reducer.cpp" in run.err or "c10d" in run.err  # PyTorch's c10d / DDP info lines


def _honoured(check):
    return ("honoured", check)


def _summary_equals(key, value):
    return _honoured(lambda r, run: run.summary[key] == value or pytest.fail(f"{key}: {run.summary[key]!r}"))


def _info_equals(key, value):
    return _honoured(lambda r, run: run.info[key] == value or pytest.fail(f"{key}: {run.info.get(key)!r}"))


def _both(entry):
    return {"tf": entry, "torch": entry}


# Checked on the runs that run alone (fixture timed_runs), in the serial pass.
REBALANCE_CHECK = _both(("timed", check_rebalance))
SIMULATION_CHECK = _both(("timed", check_simulation))


TABLE = {
    "dataset": _both(_honoured(lambda r, run: run.summary["dataset"].startswith(str(r["data"])))),
    "feature_key": _both(_honoured(lambda r, run: run.summary["config"]["feature_key"] == "feat")),
    "label_key": _both(_honoured(lambda r, run: run.summary["config"]["label_key"] == "lab")),
    "test_fraction": _both(_honoured(check_split)),
    "split_seed": _both(_honoured(check_split)),
    "eval_dataset": _both(("probe", "eval_dataset")),
    "augment": _both(_honoured(lambda r, run: run.summary["augment"] == "flip" and "augmenting" in run.out)),
    "skip_corrupt": _both(("probe", "skip_corrupt")),
    "pad_lengths": {"tf": ("probe", "pad_lengths"),
                    "torch": _refused("torch", "--pad-lengths 64,512 is not supported with --framework torch",
                                      "--pad-lengths", "64,512")},
    "model": _both(_honoured(lambda r, run: run.summary["model"]["name"] == "cnn"
                             and run.summary["model"]["weights"] != 25_604)),  # not the mlp's count
    "dropout": _both(_info_equals("dropout_layers", 1)),
    "optimizer": _both(_info_equals("optimizer", "SGD")),
    "learning_rate": _both(_summary_equals("learning_rate", pytest.approx(0.05))),
    "epochs": _both(_honoured(lambda r, run: [h["epoch"] for h in run.summary["history"]] == [0, 1])),
    "global_batch_size": _both(_honoured(check_plan_options)),
    "seed": _both(_honoured(check_plan_options)),
    "stratify": _both(_honoured(check_plan_options)),
    "balance": _both(_honoured(check_balance)),
    "bucket": _both(_honoured(check_plan_options)),
    "framework": {"tf": _summary_equals("framework", "tf"), "torch": _summary_equals("framework", "torch")},
    "replicas": _both(_summary_equals("replicas", 2)),
    "precision": {"tf": _info_equals("compute_dtype", "bfloat16"), "torch": _info_equals("compute_dtype", "bfloat16")},
    "threads": _both(_info_equals("intra_op_threads", 1)),
    "communication": {"tf": ("probe", "tf_workers"),
                      "torch": _refused("torch", "--communication ring is not supported with --framework torch",
                                        "--communication", "ring")},
    "backend": {"tf": _refused("tf", "--backend gloo is not supported with --framework tf", "--backend", "gloo"),
                "torch": _info_equals("backend", "gloo")},
    "bytes_per_pack": {"tf": ("probe", "tf_workers"), "torch": _info_equals("ddp_bucket_bytes", 65536)},
    "collective_timeout": {"tf": ("probe", "tf_workers"), "torch": _info_equals("collective_timeout_seconds", 60.0)},
    "gradient_compression": _both(_info_equals("gradient_dtype", "float16")),
    "accumulate_steps": _both(_honoured(lambda r, run: check_accumulate(run))),
    # A parameter-server cluster (4 processes) is launched and audited in the parallel pass.
    "strategy": {"tf": ("elsewhere", "tests/tf/test_ps.py::"
                                     "test_evenflow_launch_with_ps_trains_on_the_chief_and_the_same_command_resumes"),
                 "torch": _refused("torch", "--strategy ps is not supported with --framework torch", "--strategy",
                                   "ps")},
    "cluster": {"tf": ("elsewhere", "tests/cli/test_cluster_slurm.py::"
                                    "test_two_slurm_tasks_form_one_tensorflow_run_of_two_workers"),
                "torch": ("elsewhere", "tests/cli/test_cluster_slurm.py::"
                                       "test_two_slurm_tasks_form_one_pytorch_run_of_two_ranks")},
    "shard_parameters": {"tf": _refused("tf", "--shard-parameters is not supported with --framework tf",
                                        "--shard-parameters"),
                         "torch": ("probe", "sharded")},
    "loader_workers": {"tf": _refused("tf", "--loader-workers 2 is not supported with --framework tf",
                                      "--loader-workers", "2"),
                       "torch": _info_equals("loader_workers", 2)},
    "output_dir": _both(_honoured(lambda r, run: (run.dir / "summary.json").is_file())),
    "checkpoint_every": _both(_honoured(lambda r, run: check_checkpoints(run))),
    "keep_checkpoints": _both(_honoured(lambda r, run: check_checkpoints(run))),
    "resume": _both(("probe", "resume")),
    "audit": _both(_honoured(lambda r, run: main(["audit", str(run.dir)]) == 0)),
    "deterministic": {"tf": _info_equals("op_determinism", True), "torch": _info_equals("deterministic_algorithms", True)},
    "skip_nonfinite": _both(("probe", "nan")),
    "restore_after": _both(("probe", "nan")),
    "restore_lr_factor": _both(("probe", "nan")),
    "max_restores": _both(("probe", "nan")),
    "rebalance": REBALANCE_CHECK,
    "rebalance_threshold": REBALANCE_CHECK,
    # Payback 0: the short run re-plans although a re-plan costs more than these few steps can save.
    "rebalance_payback": REBALANCE_CHECK,
    "telemetry": _both(("probe", "telemetry")),
    "simulate_slow": SIMULATION_CHECK,
    "simulate_sample_ms": SIMULATION_CHECK,
    "config": _both(("probe", "nan")),
    "verbose": {"tf": _honoured(lambda r, run: check_verbose("tf", run)),
                "torch": _honoured(lambda r, run: check_verbose("torch", run))},
    # Object-storage data only (refused for local data): trained from a local S3 server there.
    "cache_dir": _both(("elsewhere", "tests/records/test_object_storage.py::test_train_from_the_store")),
    "cache_size": _both(("elsewhere", "tests/records/test_object_storage.py::test_train_from_the_store")),
    # Ray Train workers run PyTorch ranks or TensorFlow TF_CONFIG workers: trained (a worker lost) on a local Ray
    # cluster in tests/ray/.
    **{key: {"tf": ("elsewhere", "tests/ray/test_ray_train.py::test_cli_engine_ray_tf_restarts_a_lost_worker_and_the_"
                                 "audit_is_clean"),
             "torch": ("elsewhere", "tests/ray/test_ray_train.py::test_cli_engine_ray_restarts_a_lost_worker_and_"
                                    "the_audit_is_clean")}
       for key in ("engine", "workers", "address")},
}


def test_the_table_has_a_row_for_every_option():
    assert set(TABLE) == set(KEYS) | {"config", "verbose", "cache_dir", "cache_size", "engine", "workers", "address"}


def _probe(name: str, framework: str, r) -> None:
    root = r["root"]
    if name == "nan":  # --config, the anomaly options, and (tf) a between-workers option on one worker: noted
        run = r[f"{framework}_nan"]
        assert run.summary["dataset"].startswith(str(root / "nan.npz")) and run.summary["epochs"] == 1
        run.labels = r["labels"]
        check_anomaly_policy(run)
        check_applied_nan(r[f"{framework}_apply_nan"])
        if framework == "tf":
            assert "note: --communication sets the collectives between TensorFlow workers" in run.out
    elif name == "telemetry":
        assert (r[framework].dir / "telemetry.jsonl").is_file() and r[framework].summary["telemetry"]["updates"] > 0
        assert not (r[f"{framework}_nan"].dir / "telemetry.jsonl").exists()  # --no-telemetry
    elif name == "resume":
        if framework == "tf":
            resumed = r["tf_resume"].summary
            assert resumed["resumed_from"] == {"epoch": 2, "step": 0} and len(resumed["history"]) == 3
        else:
            fresh = r["torch_fresh"].summary  # --no-resume: started over, one epoch
            assert fresh["resumed_from"] is None and [h["epoch"] for h in fresh["history"]] == [0]
    elif name == "tf_workers":
        comm = r["tf_workers"].info["communication"]
        assert comm == {"implementation": "ring", "bytes_per_pack": 65536, "timeout_seconds": 60.0}, comm
        # The chief speaks for the run, with one speed, its own; worker 1 prints nothing without --verbose.
        out = r["tf_workers"].out
        assert "[worker 1] trained" not in out and "[worker 1] epoch 0" not in out, out
        assert re.search(r"^\[worker 0\] trained 1,797 samples at [\d,]+ samples/s; wrote ", out, re.M), out
    elif name == "eval_dataset":  # tf: 2 workers on builtin:digits; torch: 2 ranks on the records
        run, path, train = (r["tf_workers"], "digits_eval.npz", 1797) if framework == "tf" else \
            (r["torch_fresh"], "eval.npz", N)
        summary = run.summary
        assert summary["evaluation"] == {"on": "eval_dataset", "dataset": str(root / path), "samples": EVAL_N}
        assert summary["test_samples"] == EVAL_N and summary["split"]["train"] == train  # every sample trained
    elif name == "sharded":
        _check_sharded(r)
    elif name == "skip_corrupt":  # one corrupt record skipped, the run ends normally (its exit code: the fixture)
        assert len(r[f"skip_{framework}"].summary["skipped_records"]) == 1
    elif name == "pad_lengths":
        from evenflow.data import load_dataset
        from evenflow.run.config import load_config
        data = load_dataset(load_config(overrides={"dataset": "builtin:stdlib-docs", "pad_lengths": "64,512"}).data)
        widths = {data.train.batch(np.arange(i, i + 8))["features"].shape[1] for i in range(0, 400, 8)}
        assert widths <= {64, 512} and widths
    else:
        raise AssertionError(f"unknown probe {name}")


def _check_sharded(r) -> None:
    """2 ranks with the model sharded (FSDP): every rank writes its shards, the audit holds, auto keeps the
    plan (no rank has a time of its own), and what only DDP or per-rank timings honour is refused."""
    run = r["torch_sharded"]
    assert run.info["sharded_parameters"] is True and "FSDP, parameters sharded" in run.out
    assert "rebalancing off (auto): the model's parameters are sharded" in run.out
    newest = sorted((run.dir / "checkpoints").glob("ckpt-*"))[-1]
    assert len(list((newest / "sharded").glob("*.safetensors"))) == 2
    assert not (newest / "model.safetensors").exists()
    assert main(["audit", str(run.dir)]) == 0
    out = r["root"] / "sharded-refused"
    for argv, fragment in ((["--rebalance", "on"], "--rebalance on is not supported with --shard-parameters"),
                           (["--gradient-compression", "fp16"], "--gradient-compression fp16 is not supported"),
                           (["--bytes-per-pack", "4096"], "--bytes-per-pack 4096 is not supported"),
                           (["--simulate-slow", "0:2"], "--simulate-slow 0:2 is not supported")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # refused in this process, before PyTorch starts
            code = main(["train", "--framework", "torch", "--dataset", str(r["data"]), "--feature-key", "feat",
                         "--label-key", "lab", "--replicas", "1", "--shard-parameters", *argv, "--output-dir",
                         str(out)])
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0] and not out.exists(), lines


def _skip_corrupt_run(framework: str, root: Path, warm: bool = False) -> Run:
    """builtin:digits as records with one payload byte of record 100 flipped, trained with --skip-corrupt."""
    from evenflow.data import convert
    from evenflow.records import RecordDataset
    rec = root / f"rec-{framework}"
    convert("builtin:digits", rec, shards=1)
    _, offset, _ = RecordDataset(rec).locate([100])
    shard = sorted(rec.glob("*.tfrecord"))[0]
    raw = bytearray(shard.read_bytes())
    raw[int(offset[0]) + 12 + 5] ^= 0xFF  # a payload byte of record 100 (after its 12-byte header)
    shard.write_bytes(bytes(raw))
    runner = _tf if framework == "tf" else _torch
    extra = {} if framework == "tf" else {"world": 1}
    return runner(root, f"skip-{framework}", "--dataset", str(rec), "--skip-corrupt", "--epochs", "1", "--replicas",
                  "1", warm=warm, **extra)


TIMED = sorted(key for key, row in TABLE.items() if row["tf"][0] == "timed" or row["torch"][0] == "timed")


@pytest.mark.parametrize("framework", ["tf", "torch"])
@pytest.mark.parametrize("key", TIMED)
def test_each_option_with_a_timed_effect_is_honoured_on_a_run_alone(timed_runs, key, framework):
    kind, check = TABLE[key][framework]
    assert kind == "timed"
    check(timed_runs[framework])


@pytest.mark.parametrize("framework", ["tf", "torch"])
@pytest.mark.parametrize("key", sorted(set(TABLE) - set(TIMED)))
def test_each_option_is_honoured_or_refused(runs, capsys, tmp_path, key, framework):
    kind, what = TABLE[key][framework]
    if kind == "honoured":
        assert what(runs, runs[framework]) is not False, key
    elif kind == "probe":
        _probe(what, framework, runs)
    elif kind == "elsewhere":  # a test of its own checks the effect; it must exist
        path, name = what.split("::")
        assert re.search(rf"^def {name}\(", (SRC.parent / path).read_text(), re.M), what
    else:
        fragment = kind.split(":", 1)[1]
        fw, argv = what
        out = tmp_path / "out"
        code = main(["train", "--framework", fw, "--dataset", str(runs["data"]), "--feature-key", "feat",
                     "--label-key", "lab", "--replicas", "1", *argv, "--output-dir", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and fragment in err and len(err.splitlines()) == 1, err
        assert not out.exists()
