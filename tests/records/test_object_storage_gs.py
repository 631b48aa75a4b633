"""Shards in Google Cloud Storage (``gs://``, gcsfs), against a local emulator (gcp-storage-emulator) on 127.0.0.1.

``evenflow index`` of ``gs://`` objects writes the sidecars a local index writes; reads through the
block cache equal the local files byte for byte; an open looks every shard and sidecar up in one
listing, and a warm one asks nothing else; an object changed while read is refused.
"""
from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.records import RecordDataset
from evenflow.records.errors import RecordError

from .records_helpers import example_rows, wait_for_port, write_shard

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("gcsfs", reason="gs:// needs gcsfs (pip install gcsfs)")
pytest.importorskip("gcp_storage_emulator", reason="the gs:// tests need pip install gcp-storage-emulator")

N, SHARDS = 240, 3


def _urls() -> list[str]:
    return [f"gs://bkt/d/a-{k}.tfrecord" for k in range(SHARDS)]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator, gcsfs pointed at it (anonymous, the plain GCS filesystem: the emulator has no
    gRPC API for gcsfs's bucket-type probe), and bucket ``bkt`` holding 3 indexed shards."""
    from gcsfs.core import GCSFileSystem  # gcsfs.GCSFileSystem may be its extended class, which probes over gRPC
    root = tmp_path_factory.mktemp("gcs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--in-memory", "-q"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    classes = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        mp.setenv("EVENFLOW_CACHE_DIR", str(root / "cache"))
        mp.setenv("EVENFLOW_BLOCK_SIZE", "2K")
        mp.setitem(fsspec.config.conf, "gs", {"token": "anon"})
        for p in classes:
            fsspec.register_implementation(p, GCSFileSystem, clobber=True)
        try:
            wait_for_port(port)
            fs = fsspec.filesystem("gs")
            fs.mkdir("bkt")
            rows, local = example_rows(N), root / "local"
            local.mkdir()
            for k in range(SHARDS):
                write_shard(local / f"a-{k}.tfrecord", rows, k * N // SHARDS, (k + 1) * N // SHARDS)
                fs.put_file(str(local / f"a-{k}.tfrecord"), f"bkt/d/a-{k}.tfrecord")
            assert main(["index", "gs://bkt/d/a-*.tfrecord", "--label-key", "label"]) == 0
            yield {"fs": fs, "root": root, "local": local, "rows": rows}
        finally:
            server.kill()
            server.wait()
            for p, cls in classes.items():
                fsspec.register_implementation(p, cls, clobber=True)


def test_index_writes_the_sidecars_a_local_index_writes(gcs, capsys):
    local = [str(gcs["local"] / f"a-{k}.tfrecord") for k in range(SHARDS)]
    assert main(["index", *local, "--label-key", "label"]) == 0
    capsys.readouterr()
    for k in range(SHARDS):
        for suffix in (".idx", ".meta.npz"):
            local = gcs["local"] / f"a-{k}.tfrecord{suffix}"
            assert gcs["fs"].cat_file(f"bkt/d/a-{k}.tfrecord{suffix}") == local.read_bytes()


def test_reads_equal_the_local_files_and_a_warm_open_lists_only(gcs, tmp_path, monkeypatch):
    from evenflow.records.remote import lookup, mirror
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "cold"))
    rounds = []
    real = mirror.run_all
    for module in (lookup, mirror):
        monkeypatch.setattr(module, "run_all", lambda reqs, deadline_s: rounds.append(reqs) or real(reqs, deadline_s))
    local = RecordDataset([str(gcs["local"] / f"a-{k}.tfrecord") for k in range(SHARDS)])
    ids = np.random.default_rng(1).permutation(N)
    with RecordDataset(_urls()) as ds:
        assert [r.method for r in rounds[0]] == ["find"]  # every shard's and sidecar's size and ETag
        assert np.array_equal(ds.labels, gcs["rows"]["label"])
        for lo in range(0, N, 32):
            b = ids[lo:lo + 32]
            assert ds.read_batch(b, verify=True) == local.read_batch(b)
        assert ds.remote_stats["bytes"] == sum(s.file_size for s in ds.shards)  # no byte twice
    rounds.clear()
    with RecordDataset(_urls()) as ds:
        ds.check_content()
        assert [[r.method for r in reqs] for reqs in rounds] == [["find"]]
        assert ds.remote_stats == {"requests": 0, "bytes": 0}


def test_an_object_changed_while_read_is_refused(gcs, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENFLOW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("EVENFLOW_BLOCK_SIZE", "40")  # the checks on open leave blocks to read
    fs = gcs["fs"]
    for suffix in ("", ".idx", ".meta.npz"):
        fs.copy(f"bkt/d/a-0.tfrecord{suffix}", f"bkt/d/z.tfrecord{suffix}")
    ds = RecordDataset(["gs://bkt/d/z.tfrecord"])
    other = tmp_path / "other.tfrecord"
    write_shard(other, example_rows(N, seed=7), 0, N // SHARDS)
    fs.put_file(str(other), "bkt/d/z.tfrecord")
    with pytest.raises(RecordError, match="describe other records: the object changed in the store while it was read"):
        ds.read_batch(np.arange(len(ds)))
    ds.close()
