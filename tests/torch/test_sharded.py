"""Sharded parameters (FSDP) under real gloo process groups on 127.0.0.1: the same plan, the same weights.

N = 203 samples, a global batch of 30 (7 steps, the last of 23 samples), SGD with momentum,
sample 57 poisoned with NaN features (its step is skipped on every rank). Two ranks with the
model sharded end with DDP's weights, train the same ids, and write sharded checkpoints from
which the same run resumes on 2 sharded ranks and on 1 plain process (DCP reshards); a DDP
checkpoint resumes into a sharded model.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SPEC = {"n": 203, "classes": 5, "batch": 30, "seed": 3, "lr": 0.1, "momentum": 0.9, "features": [6],
        "eval_n": 31, "nan_ids": [57], "pg_timeout": 20}


def _weights(found: dict) -> list[np.ndarray]:
    return [found[k] for k in sorted((k for k in found if k.startswith("w")), key=lambda k: int(k[1:]))]


def _ok(groups, names):
    out = {}
    for name, ranks in zip(names, groups):
        for r, run in enumerate(ranks):
            assert run.returncode == 0, f"{name}: rank {r} failed:\n{run.stderr[-3000:]}"
        out[name] = [run.found for run in ranks]
    return out


@pytest.fixture(scope="module")
def runs(warm_workers):
    ckpt, ddp_ckpt = warm_workers.root / "sharded-ckpt", warm_workers.root / "ddp-ckpt"
    first = _ok(warm_workers([
        (dict(SPEC, epochs=2, checkpoint_dir=str(ddp_ckpt)), 2, "ddp"),
        (dict(SPEC, epochs=2, shard=True, checkpoint_dir=str(ckpt), checkpoint_every=3), 2, "fsdp"),
        (dict(SPEC, epochs=3, shard=True), 2, "fsdp3"),
    ], timeout=180), ["ddp", "fsdp", "fsdp3"])
    copies = {name: warm_workers.root / f"ckpt-{name}" for name in ("again", "plain")}
    for copy in copies.values():
        shutil.copytree(ckpt, copy)
    second = _ok(warm_workers([
        (dict(SPEC, epochs=3, shard=True, resume=True, checkpoint_dir=str(copies["again"])), 2, "again"),
        (dict(SPEC, epochs=3, resume=True, checkpoint_dir=str(copies["plain"])), 1, "plain"),
        (dict(SPEC, epochs=3, shard=True, resume=True, checkpoint_dir=str(ddp_ckpt)), 2, "from_ddp"),
    ], timeout=180), ["again", "plain", "from_ddp"])
    return {**first, **second, "ckpt": ckpt}


def test_two_sharded_ranks_train_the_same_ids_to_ddps_weights(runs):
    for ddp, fsdp in zip(runs["ddp"], runs["fsdp"]):
        np.testing.assert_array_equal(ddp["seen"], fsdp["seen"])
        np.testing.assert_array_equal(ddp["skipped"], fsdp["skipped"])
        assert len(fsdp["skipped"]) == 2  # the NaN sample's step, in each epoch, on every rank
        for a, b in zip(_weights(ddp), _weights(fsdp)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [int(f["eval_count"]) for f in runs["fsdp"]] == [SPEC["eval_n"]] * 2


def test_sharded_checkpoints_are_written_by_every_rank_without_a_whole_model_file(runs):
    last = sorted(p for p in (runs["ckpt"] / "checkpoints").iterdir() if p.name.startswith("ckpt-"))[-1]
    names = sorted(p.name for p in last.iterdir())
    assert "model.safetensors" not in names and "sharded" in names and "optimizer.json" in names, names
    shards = sorted(p.name for p in (last / "sharded").glob("*.safetensors"))
    assert len(shards) == 2, shards  # one file per rank


def test_a_sharded_checkpoint_resumes_on_two_sharded_ranks_and_on_one_plain_process(runs):
    whole = _weights(runs["fsdp3"][0])
    for name in ("again", "plain", "from_ddp"):  # and a DDP checkpoint into a sharded model
        found = runs[name][0]
        assert tuple(found["start"]) == (2, 0), name
        for a, b in zip(whole, _weights(found)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_killed_sharded_rank_stops_the_other_and_the_rerun_resumes_exactly(runs, warm_workers):
    ckpt = str(warm_workers.root / "killed-ckpt")
    spec = dict(SPEC, epochs=3, shard=True, checkpoint_dir=ckpt, checkpoint_every=2, die_at=[1, 1, 5],
                pg_timeout=15)
    (killed,) = warm_workers([(spec, 2, "kill")], timeout=90)
    assert killed[1].returncode == -9  # SIGKILL, as with kill -9
    assert killed[0].returncode == 3, killed[0].stderr[-2000:]
    assert "lost contact with another rank after Cursor(1, 5)" in killed[0].stderr, killed[0].stderr[-2000:]
    assert "ckpt-00001-000004" in killed[0].stderr
    (resumed,) = warm_workers([(dict(spec, die_at=None, resume=True), 2, "rerun")], timeout=90)
    for r, run in enumerate(resumed):
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.found["start"].tolist() == [1, 4]
        # The same shards, momentum buffers and plan remainder: the uninterrupted run's weights, bitwise.
        for a, b in zip(_weights(run.found), _weights(runs["fsdp3"][r])):
            np.testing.assert_array_equal(a, b)
