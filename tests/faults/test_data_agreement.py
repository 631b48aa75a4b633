"""Every process of a run agrees on the data, not only the plan, before the first step.

Two workers of one run started on different data — builtin:digits on one, a ``.npz`` of noise
with the same labels on the other (the same plan: the plan is made of the labels), or noise of
another feature shape — stop with exit 2 and the same one line on every process, naming the
data digests and the fix, before any step, and leave no run directory. Real processes on
127.0.0.1 (torch ranks over gloo, TensorFlow MultiWorkerMirroredStrategy workers), each under a
hard ``timeout -k 5`` limit. Under ``--strategy ps`` only the chief reads the data: a worker and
a parameter server given a dataset that does not exist serve, and the chief trains on its own.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

import evenflow as ef
from evenflow.data.arrays import digits_arrays
from evenflow.data.identity import source_identity
from evenflow.data.source import ArraySource, SubsetSource
from evenflow.run.preflight import check_workers_agree, identity_chunks, plan_vector
from evenflow.tf.launch.cluster import tf_config
from evenflow.tf.launch.local import free_ports
from tests._warm import warm_python

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
for _key in ("TF_CONFIG", "EVENFLOW_REPLICAS_PER_WORKER", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
    ENV.pop(_key, None)
DATA_ERROR = "evenflow train: error: the workers loaded different data (data digest "
FIX = "start every worker on the same --dataset (same files, keys, split)"
LIMIT = 120  # seconds each process may take (hard: SIGKILL 5 s later); a bound, never waited out when all is well


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """``builtin:digits``, noise of the same shape with the digits' labels, and noise of another shape."""
    root = tmp_path_factory.mktemp("data")
    x, y = digits_arrays()
    rng = np.random.default_rng(0)
    np.savez(root / "noise.npz", x=rng.random(x.shape).astype(np.float32), y=y)
    np.savez(root / "flat.npz", x=rng.random((len(y), 16)).astype(np.float32), y=y)
    return {"same shape": str(root / "noise.npz"), "other shape": str(root / "flat.npz")}


def _train(framework: str, datasets: list[str], run_dir: Path) -> list[tuple[int, str]]:
    """Start one ``evenflow train`` per dataset as the workers (TF) or ranks (torch) of one run; (exit code,
    stderr) of each."""
    args = ["--epochs", "1", "--collective-timeout", "60", "--output-dir", str(run_dir)]
    if framework == "torch":
        args += ["--framework", "torch", "--loader-workers", "0"]
        port = free_ports(1)[0]
        envs = [dict(ENV, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for r in range(2)]
    else:
        args += ["--replicas", "1"]
        addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
        envs = [dict(ENV, TF_CONFIG=tf_config(addresses, i)) for i in range(2)]
    python = warm_python(ENV, "torch" if framework == "torch" else "tensorflow")  # started warm (tests/_warm.py)
    procs = [subprocess.Popen(["timeout", "-k", "5", str(LIMIT), *python, "-m", "evenflow", "train",
                               "--dataset", dataset, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for dataset, env in zip(datasets, envs)]
    return [(p.returncode, err) for p in procs for _, err in [p.communicate(timeout=LIMIT + 15)]]


@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize("other", ["same shape", "other shape"])
def test_workers_on_different_data_stop_with_exit_2_before_any_step(tmp_path, data, framework, other):
    if framework == "torch":
        pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    done = _train(framework, ["builtin:digits", data[other]], run_dir)
    lines = []
    for worker, (code, err) in enumerate(done):
        assert code == 2, (worker, code, err[-3000:])
        assert "Traceback" not in err, err[-3000:]
        lines.append(err.strip().splitlines()[-1])
    assert lines[0] == lines[1]  # the same line on every process
    assert lines[0].startswith(DATA_ERROR), lines[0]
    assert "on workers [0], " in lines[0] and " on workers [1]: " in lines[0] and FIX in lines[0], lines[0]
    assert "plan differently" not in lines[0]  # the labels, hence the plans, are the same
    assert not run_dir.exists()  # a run that could not start leaves no run directory


def test_the_same_data_on_every_worker_trains(tmp_path, data):
    pytest.importorskip("torch")
    done = _train("torch", [data["same shape"]] * 2, tmp_path / "run")
    assert [code for code, _ in done] == [0, 0], [err[-2000:] for _, err in done]
    assert (tmp_path / "run" / "summary.json").exists()


_OWN_LOOP = """
import sys, numpy as np, torch
import evenflow as ef
from evenflow.torch import ArraySource, Trainer, finish_distributed, init_distributed
rank, world, _ = init_distributed("gloo", timeout_s=60)
rng = np.random.default_rng(rank if sys.argv[1] == "differ" else 0)
source = ArraySource(rng.random((40, 4)).astype(np.float32), np.arange(40) % 3)
plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=8, seed=0)
model = torch.nn.Linear(4, 3)
trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
try:
    print("ran", trainer.evaluate(source, plan) if sys.argv[2] == "evaluate" else trainer.fit(source, plan, 1))
except ValueError as e:
    print("refused:", e)
finish_distributed()
"""


@pytest.mark.parametrize("call", ["fit", "evaluate"])
@pytest.mark.parametrize("sources", ["differ", "same"])
def test_own_loop_ranks_with_different_arrays_are_refused_on_both(call, sources):
    pytest.importorskip("torch")
    port = free_ports(1)[0]
    procs = [subprocess.Popen(["timeout", "-k", "5", str(LIMIT), *warm_python(ENV, "torch"), "-c", _OWN_LOOP, sources,
                               call],
                              env=dict(ENV, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=LIMIT + 15) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    for out, _ in outs:
        if sources == "same":
            assert out.startswith("ran"), out
        else:
            assert out.startswith("refused: the processes read different data (processes [0]; processes [1] agree "
                                  "among themselves"), out
            assert "give every process the same source" in out


def test_a_ps_worker_and_server_never_read_the_dataset(tmp_path):
    """Under --strategy ps the chief reads the data and sends each step's batch: the servers' --dataset is unused."""
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    run_dir = tmp_path / "run"

    def start(kind: str, dataset: str, output=subprocess.PIPE) -> subprocess.Popen:
        env = dict(ENV, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}}))
        # Each in a session of its own: the servers serve until stopped, and are stopped as a group (started warm,
        # tests/_warm.py: the SIGKILLed client takes its program with it).
        return subprocess.Popen(["timeout", "-k", "5", str(LIMIT + 30), *warm_python(ENV), "-m", "evenflow", "train",
                                 "--strategy", "ps", "--dataset", dataset, "--epochs", "1",
                                 "--global-batch-size", "256", "--output-dir", str(run_dir)],
                                env=env, stdout=output, stderr=output, text=True, start_new_session=True)

    servers = [start(kind, str(tmp_path / "nowhere.npz"), subprocess.DEVNULL) for kind in ("worker", "ps")]
    try:
        chief = start("chief", "builtin:digits")
        out, err = chief.communicate(timeout=LIMIT + 45)
        assert chief.returncode == 0, err[-3000:]
        assert all(s.poll() is None for s in servers)  # still serving: nothing made them load nowhere.npz
    finally:
        for s in servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.pid, signal.SIGKILL)
            s.wait(timeout=30)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test_samples"] == 359 and summary["dataset"].startswith("builtin:digits:")


# -- the check itself, on rows as the collective would return them -------------------------------------
PLAN = ef.Plan(ef.Index(40, labels=np.arange(40) % 4), ef.Topology(3), global_batch_size=8, seed=0)
A, B = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"


def _refusal(rows: list[tuple], mine=(PLAN, A)) -> str:
    gathered = np.stack([np.concatenate([plan_vector(p), identity_chunks(i)]) for p, i in rows])
    with pytest.raises(ValueError) as caught:
        check_workers_agree(lambda _: gathered, mine[0], 1, len(rows), mine[1])
    return str(caught.value)


def test_the_error_names_each_group_of_workers_and_its_digest():
    msg = _refusal([(PLAN, A), (PLAN, B), (PLAN, A)])
    assert msg.startswith("the workers loaded different data (data digest 0123456789ab on workers [0, 2], "
                          "fedcba987654 on workers [1]: "), msg
    assert msg.endswith(FIX + " and with the same config and flags (evenflow launch does)"), msg


def test_the_error_names_both_when_plan_and_data_differ():
    other = ef.Plan(ef.Index(40, labels=np.arange(40) % 4), ef.Topology(3), global_batch_size=8, seed=5)
    msg = _refusal([(PLAN, A), (other, B), (PLAN, None)])
    assert msg.startswith("the workers would plan differently ("), msg
    assert "seed 0 on worker 0 but 5 on worker 1; agreeing groups: workers [0, 2]; workers [1])" in msg
    assert ") and loaded different data (data digest 0123456789ab on workers [0], fedcba987654 on workers [1], " \
           "none on workers [2]: " in msg and FIX in msg


def test_workers_that_agree_on_both_pass():
    rows = np.tile(np.concatenate([plan_vector(PLAN), identity_chunks(A)]), (3, 1))
    check_workers_agree(lambda _: rows, PLAN, 1, 3, A)


def test_a_digest_travels_exactly_in_float64_chunks():
    chunks = identity_chunks(A)
    assert "".join(f"{int(c):0{w}x}" for c, w in zip(chunks, (12, 12, 8))) == A
    assert not np.array_equal(identity_chunks(A[:-1] + "0"), chunks)  # the last hex digit counts too


def test_source_identity_follows_the_content_and_the_subset():
    x, y = np.zeros((10, 3), np.float32), np.arange(10) % 2
    same, noise = ArraySource(x, y), ArraySource(x + 1, y)
    assert source_identity(same) == source_identity(ArraySource(x.copy(), y.copy()))
    assert source_identity(same) != source_identity(noise)  # same labels (same plan), other features
    assert source_identity(same) != source_identity(ArraySource(x.reshape(10, 3, 1), y))  # another shape
    assert source_identity(SubsetSource(same, [1, 2])) != source_identity(SubsetSource(same, [1, 3]))
    assert source_identity(object()) is None


def test_a_large_array_is_named_by_its_shape_and_evenly_spaced_rows(monkeypatch):
    import evenflow.data.identity as identity

    monkeypatch.setattr(identity, "FULL_BYTES", 0)
    monkeypatch.setattr(identity, "SAMPLED_ROWS", 3)  # rows 0, 4 and 9 of 10
    x, y = np.zeros((10, 2), np.float32), np.arange(10) % 2
    base = source_identity(ArraySource(x, y))
    sampled, between = x.copy(), x.copy()
    sampled[4, 0], between[5, 0] = 1, 1
    assert source_identity(ArraySource(sampled, y)) != base
    assert source_identity(ArraySource(between, y)) == base  # the documented limit of a sampled digest
    assert source_identity(ArraySource(np.zeros((10, 2, 1), np.float32), y)) != base


def test_text_and_records_sources_are_named_by_their_content(tmp_path):
    from evenflow.data import RecordSource, TextData, TextSource, convert

    one = TextData.from_sequences([[1, 2], [3], [4, 5, 6]], [0, 1, 0])
    other = TextData.from_sequences([[1, 2], [3], [4, 5, 7]], [0, 1, 0])
    assert source_identity(TextSource(one)) == source_identity(TextSource(one))
    assert source_identity(TextSource(one)) != source_identity(TextSource(other))
    convert("builtin:digits", tmp_path / "digits", progress=False)
    whole = source_identity(RecordSource(tmp_path / "digits"))
    assert whole is not None and whole == source_identity(RecordSource(tmp_path / "digits"))
    assert source_identity(RecordSource(tmp_path / "digits", ids=np.arange(100))) != whole
    assert source_identity(RecordSource(tmp_path / "digits", scale=1 / 16)) != whole
