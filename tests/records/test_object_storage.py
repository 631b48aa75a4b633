"""Shards and sidecars in object storage, against a real S3-compatible server (moto's) on 127.0.0.1.

One server and one indexed bucket per module: ``evenflow index`` of ``s3://`` objects, ``inspect``,
reads equal to the local files through the block cache (a cold open of shards no larger than a
block asks the store in one round whatever the shard count, a warm one lists the folder only), training with TensorFlow and PyTorch (a resumed
run, and one killed mid-epoch and resumed, audited exactly once), a store that stalls (SIGSTOP)
retried, one that stays down failing with one line, a changed object refused, a bad URL, a missing
bucket, missing credentials and a ``gs://`` URL without gcsfs each one line, and a cache limit
smaller than the open data kept and warned about.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.records import RecordDataset
from evenflow.records.errors import RecordError

from .records_helpers import example_rows, wait_for_port, write_shard

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

SRC = Path(__file__).resolve().parents[2] / "src"
N, SHARDS = 240, 3
GLOB = "s3://bkt/d/a-*.tfrecord"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A moto S3 server process, the environment that points at it, and bucket ``bkt`` holding 3 shards
    (``d/a-{0,1,2}.tfrecord``, no sidecars yet) whose local copies are under ``local``."""
    root = tmp_path_factory.mktemp("store")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "EVENFLOW_CACHE_DIR": str(root / "cache"), "EVENFLOW_BLOCK_SIZE": "2K"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        wait_for_port(port)
        fs = fsspec.filesystem("s3")
        fs.mkdir("bkt")
        rows = example_rows(N)
        local = root / "local"
        local.mkdir()
        for k in range(SHARDS):
            path = local / f"a-{k}.tfrecord"
            write_shard(path, rows, k * N // SHARDS, (k + 1) * N // SHARDS)
            fs.put_file(str(path), f"bkt/d/a-{k}.tfrecord")
        yield {"server": server, "fs": fs, "root": root, "local": local, "rows": rows, "env": env}
    finally:
        server.kill()
        server.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def indexed(store):
    """The bucket after ``evenflow index 's3://bkt/d/a-*.tfrecord' --label-key label``."""
    assert main(["index", GLOB, "--label-key", "label"]) == 0
    return store


def _urls() -> list[str]:
    return [f"s3://bkt/d/a-{k}.tfrecord" for k in range(SHARDS)]


def _one_line(capsys, code: int, fragment: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
    return err


def test_index_writes_the_sidecars_next_to_the_objects(indexed):
    fs = indexed["fs"]
    for k in range(SHARDS):
        local = indexed["local"] / f"a-{k}.tfrecord"
        assert fs.cat_file(f"bkt/d/a-{k}.tfrecord.idx") == (local.parent / (local.name + ".idx")).read_bytes()
        assert fs.exists(f"bkt/d/a-{k}.tfrecord.meta.npz")


def test_inspect_reads_the_remote_labels(indexed, capsys, tmp_path, monkeypatch):
    for k in ("EVENFLOW_CACHE_DIR", "EVENFLOW_CACHE_SIZE"):
        monkeypatch.setenv(k, os.environ.get(k, "1G"))  # restored after the flags set them
    code = main(["inspect", "--dataset", GLOB, "--feature-key", "x", "--label-key", "label", "--replicas", "2",
                 "--batch-size", "16", "--json", "--cache-dir", str(tmp_path / "c"), "--cache-size", "100M"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["real_samples"] == N
    assert (tmp_path / "c" / "objects").is_dir()  # --cache-dir honoured


def test_cache_flags_are_refused_for_local_data(indexed, capsys, tmp_path):
    code = main(["inspect", "--dataset", str(indexed["local"] / "a-*.tfrecord"), "--replicas", "2",
                 "--batch-size", "16", "--cache-dir", "/tmp/x"])
    _one_line(capsys, code, "--cache-dir applies to data in object storage")
    code = main(["train", "--dataset", str(indexed["local"] / "a-*.tfrecord"), "--cache-size", "1G",
                 "--output-dir", str(tmp_path / "run")])
    _one_line(capsys, code, "--cache-size applies to data in object storage")
    assert not (tmp_path / "run").exists()


def test_reads_equal_the_local_files_and_a_warm_cache_asks_nothing(indexed, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "cold"))
    local = RecordDataset([str(indexed["local"] / f"a-{k}.tfrecord") for k in range(SHARDS)])
    ids = np.random.default_rng(1).permutation(N)
    with RecordDataset(_urls()) as ds:
        assert len(ds) == N and np.array_equal(ds.labels, indexed["rows"]["label"])
        for lo in range(0, N, 32):
            b = ids[lo:lo + 32]
            assert ds.read_batch(b, verify=True) == local.read_batch(b)
        cold = ds.remote_stats
        size = sum(s.file_size for s in ds.shards)
        # Every block fetched once: as many requests as blocks, no byte twice.
        assert cold["bytes"] == size and cold["requests"] == sum(-(-s.file_size // 2048) for s in ds.shards)
    with RecordDataset(_urls()) as ds:  # a second process of the machine, or epoch 2
        ds.check_content()
        assert ds.decode_batch(ids[:8])["label"].tolist() == indexed["rows"]["label"][ids[:8]].tolist()
        assert ds.remote_stats == {"requests": 0, "bytes": 0}


def _count_rounds(monkeypatch) -> list:
    """The requests of each round the store is asked (look-ups, sidecars, blocks), appended as they go."""
    from evenflow.records.remote import lookup, mirror
    rounds = []
    real = mirror.run_all
    for module in (lookup, mirror):
        monkeypatch.setattr(module, "run_all", lambda reqs, deadline_s: rounds.append(reqs) or real(reqs, deadline_s))
    return rounds


def _names(requests) -> list[str]:
    return [r.method if isinstance(r.method, str) else "get" for r in requests]


def test_a_cold_open_of_small_shards_is_one_round_and_a_warm_one_one_listing(indexed, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "cold"))
    monkeypatch.setenv("EVENFLOW_BLOCK_SIZE", "1M")  # every shard one block
    rounds = _count_rounds(monkeypatch)
    with RecordDataset(_urls()) as ds:
        # One listing of the folder, and each shard's 2 sidecars and its one block, all at once.
        assert len(rounds) == 1 and _names(rounds[0]) == ["find"] + ["get"] * 3 * SHARDS
        assert ds.remote_stats["requests"] == SHARDS and ds.remote_stats["bytes"] == sum(s.file_size for s in ds.shards)
        ds.read_batch(np.arange(N))
        assert len(rounds) == 1
    assert not any((tmp_path / "cold" / "incoming").iterdir())  # each first block moved into its object's folder
    rounds.clear()
    with RecordDataset(_urls()) as ds:  # a second process of the machine, or epoch 2: the listing only
        assert np.array_equal(ds.labels, indexed["rows"]["label"])
        ds.read_batch(np.arange(N))
        assert [_names(r) for r in rounds] == [["find"]] and ds.remote_stats == {"requests": 0, "bytes": 0}
    versions = next((tmp_path / "cold" / "objects").glob("a-1.tfrecord-*")) / "a-1.tfrecord.versions"
    versions.write_text(versions.read_text().replace(" ", " 1", 1))  # cached sidecars of another version
    rounds.clear()
    with RecordDataset(_urls()) as ds:  # those are read again, with nothing else
        assert [_names(r) for r in rounds] == [["find"], ["get"] * 2]
        assert {r.url for r in rounds[1]} == {_urls()[1] + ".idx", _urls()[1] + ".meta.npz"}
        assert np.array_equal(ds.labels, indexed["rows"]["label"])


def test_an_open_of_shards_of_many_blocks_asks_the_blocks_its_checks_read_after(indexed, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "cold"))
    monkeypatch.setenv("EVENFLOW_BLOCK_SIZE", "40")  # blocks smaller than a record: the checks on open leave some
    rounds = _count_rounds(monkeypatch)
    with RecordDataset(_urls()) as ds:
        # The listing with each shard's sidecars and first block; then the blocks of the records the checks read.
        assert _names(rounds[0]) == ["find"] + ["get"] * 3 * SHARDS
        assert len(rounds) == 2 and {r.url for r in rounds[1]} == set(_urls())
        ds.read_batch(np.arange(N))  # the rest: one round of blocks, each answering its ETag (no look-ups)
        assert len(rounds) == 3 and _names(rounds[2]) == ["get"] * len(rounds[2])
        assert ds.remote_stats["bytes"] == sum(s.file_size for s in ds.shards)


def _train(framework: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "evenflow", "train", "--framework", framework, "--dataset", GLOB,
                           "--feature-key", "x", "--label-key", "label", "--replicas", "1", "--global-batch-size", "16",
                           "--output-dir", str(out), *extra], env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_train_from_the_store(indexed, tmp_path, framework):
    pytest.importorskip("tensorflow" if framework == "tf" else "torch")
    cache = tmp_path / "cache"
    proc = _train(framework, tmp_path / "run", "--epochs", "1", "--cache-size", "1G", "--cache-dir", str(cache))
    assert proc.returncode == 0, proc.stderr
    assert len(list((cache / "objects").iterdir())) == SHARDS  # the blocks went to --cache-dir
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"].startswith(f"{GLOB}: TFRecord files ({N} in {SHARDS} shards")


def test_a_resumed_run_trains_every_sample_exactly_once(indexed, tmp_path, capsys):
    pytest.importorskip("torch")
    run = tmp_path / "run"
    first = _train("torch", run, "--epochs", "1", "--audit")
    assert first.returncode == 0, first.stderr
    second = _train("torch", run, "--epochs", "2", "--audit")
    assert second.returncode == 0, second.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] is not None and len(summary["history"]) == 2
    assert main(["audit", str(run)]) == 0
    capsys.readouterr()
    assert main(["audit", str(run), "--locate", "0", "--json"]) == 0
    located = json.loads(capsys.readouterr().out)["locations"][0]
    assert located["file"].startswith("s3://bkt/d/a-") and located["record"] >= 0


def test_a_stalled_store_is_retried(indexed, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "cold"))
    monkeypatch.setenv("EVENFLOW_STORE_TIMEOUT", "0.5")
    server = indexed["server"]
    server.send_signal(signal.SIGSTOP)
    wake = threading.Timer(2.0, server.send_signal, (signal.SIGCONT,))
    wake.start()
    try:
        t0 = time.monotonic()
        with RecordDataset(_urls()) as ds:  # asked while the server is stopped: retried until it answers
            assert time.monotonic() - t0 >= 1.5
            got = ds.decode_batch(np.arange(N))
        assert np.array_equal(got["label"], indexed["rows"]["label"])
    finally:
        wake.join()


def test_a_store_down_past_the_deadline_is_one_line(indexed, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", os.environ["EVENFLOW_CACHE_DIR"])  # restored after --cache-dir
    monkeypatch.setenv("EVENFLOW_STORE_TIMEOUT", "0.3")
    monkeypatch.setenv("EVENFLOW_STORE_DEADLINE", "1")
    server = indexed["server"]
    server.send_signal(signal.SIGSTOP)
    try:
        code = main(["inspect", "--dataset", GLOB, "--feature-key", "x", "--label-key", "label", "--replicas", "2",
                     "--batch-size", "16", "--cache-dir", str(tmp_path / "c")])
    finally:
        server.send_signal(signal.SIGCONT)
    err = _one_line(capsys, code, "the store kept failing for 1 s")
    assert "evenflow inspect: error: s3://bkt/d/a-" in err and "EVENFLOW_STORE_DEADLINE" in err


def test_a_changed_object_is_other_data(indexed, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("EVENFLOW_BLOCK_SIZE", "40")  # blocks smaller than a record: the checks on open leave some
    fs = indexed["fs"]
    other = tmp_path / "other.tfrecord"
    write_shard(other, example_rows(N, seed=7), 0, N // SHARDS)  # same count and layout: the same size
    for suffix in (".idx", ".meta.npz"):
        fs.copy(f"bkt/d/a-0.tfrecord{suffix}", f"bkt/d/z.tfrecord{suffix}")
    assert os.path.getsize(other) == fs.size("bkt/d/a-0.tfrecord")
    # Changed before open: the sidecars describe other records.
    fs.put_file(str(other), "bkt/d/z.tfrecord")
    with pytest.raises(RecordError, match=r"^s3://bkt/d/z.tfrecord.*its sidecars s3://bkt/d/z.tfrecord.idx and "
                                          r"s3://bkt/d/z.tfrecord.meta.npz describe other records"):
        RecordDataset(["s3://bkt/d/z.tfrecord"])
    # Changed while read: refused before a block of the new object mixes with the old.
    fs.put_file(str(indexed["local"] / "a-0.tfrecord"), "bkt/d/z.tfrecord")
    ds = RecordDataset(["s3://bkt/d/z.tfrecord"])
    fs.put_file(str(other), "bkt/d/z.tfrecord")
    with pytest.raises(RecordError, match="describe other records: the object changed in the store while it was read"):
        ds.read_batch(np.arange(len(ds)))


def test_bad_urls_are_one_line(indexed, capsys):
    def inspect(url):
        return main(["inspect", "--dataset", url, "--replicas", "2", "--batch-size", "16"])

    _one_line(capsys, inspect("s3://bkt/d/none-*.tfrecord"), "the pattern matches no object in the store")
    _one_line(capsys, inspect("s3://bkt/d/none.tfrecord"), "s3://bkt/d/none.tfrecord: no such object in the store")
    _one_line(capsys, inspect("s3://no-such-bucket/a.tfrecord"), "no such bucket in the store")
    assert not any((Path(os.environ["EVENFLOW_CACHE_DIR"]) / "incoming").iterdir())  # nothing left of them


def test_missing_credentials_are_one_line(indexed, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(SRC), AWS_ENDPOINT_URL=indexed["env"]["AWS_ENDPOINT_URL"],
               AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), EVENFLOW_STORE_DEADLINE="5")
    proc = subprocess.run([sys.executable, "-m", "evenflow", "index", "s3://bkt/d/a-0.tfrecord"], env=env,
                          capture_output=True, text=True, timeout=60)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "no credentials for the store" in err, err


def test_a_run_killed_mid_epoch_resumes_exactly_once(indexed, tmp_path, capsys):
    pytest.importorskip("torch")
    from evenflow.run.checkpoint_list import list_checkpoints
    run = tmp_path / "run"
    args = ["--epochs", "2", "--audit", "--checkpoint-every", "2", "--loader-workers", "0",
            "--simulate-sample-ms", "20"]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cmd = [sys.executable, "-m", "evenflow", "train", "--framework", "torch", "--dataset", GLOB, "--feature-key", "x",
           "--label-key", "label", "--replicas", "1", "--global-batch-size", "16", "--output-dir", str(run), *args]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any(c.cursor.step > 0 for c in list_checkpoints(run)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the first complete checkpoint within the epoch (step 2)
        assert first.poll() is None, "the run ended before it could be killed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert not (run / "summary.json").exists()  # killed mid-run, in the first of 2 epochs of 12 steps
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    start = summary["resumed_from"]
    assert start is not None and start["epoch"] == 0 and start["step"] > 0 and len(summary["history"]) == 2, start
    assert main(["audit", str(run)]) == 0  # every sample trained on exactly once per epoch
    assert "exactly once" in capsys.readouterr().out


# A fresh process in which gcsfs cannot be imported (the test install has it): the command, then the Python reader.
_NO_GCSFS = """
import sys
sys.modules["gcsfs"] = None  # import gcsfs raises ImportError, as where it is not installed
from evenflow.cli import main
from evenflow.records import RecordDataset
from evenflow.records.errors import RecordError
code = main(["inspect", "--dataset", "gs://bkt/d/a-*.tfrecord", "--replicas", "2", "--batch-size", "16"])
try:
    RecordDataset(["gs://bkt/d/a-0.tfrecord"])
except RecordError as e:
    print("reader:", e)
sys.exit(code)
"""


def test_a_gs_url_without_gcsfs_is_one_line():
    run = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-c", _NO_GCSFS], capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip() == ("evenflow inspect: error: gs://bkt/d/a-*.tfrecord: gs:// URLs need a package that "
                                  "is not installed: pip install gcsfs")
    assert run.stdout.strip().startswith("reader: ") and run.stdout.strip().endswith("pip install gcsfs")


def test_the_cache_keeps_what_an_open_dataset_fetched_and_warns_above_its_limit(indexed, tmp_path, monkeypatch):
    from evenflow.records.remote import cache
    monkeypatch.setattr(cache, "_WARNED", [False])
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("EVENFLOW_CACHE_SIZE", "4K")  # smaller than the set
    objects = tmp_path / "c" / "objects"
    with pytest.warns(UserWarning, match=r"holds .* above its limit of 4K .*the objects this process has open "
                                         r"are kept"):
        with RecordDataset(_urls()) as ds:
            ds.fetch()
            assert len(list(objects.iterdir())) == SHARDS  # nothing this process reads is evicted
            assert cache.disk_bytes(str(objects)) > 4096
    with RecordDataset(_urls()[:1]) as ds:  # closed objects are evicted down to the limit
        ds.fetch()
        assert len(list(objects.iterdir())) == 1
