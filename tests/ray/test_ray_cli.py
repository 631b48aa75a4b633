"""``evenflow train --engine ray``: each flag it cannot honour is refused with exit 2 and one line naming it,
before Ray starts and before anything is written (no Ray cluster needed)."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.cli import main

REFUSED = [
    (["--workers", "2"], "--workers applies to --engine ray only"),
    (["--address", "127.0.0.1:6379"], "--address applies to --engine ray only"),
    (["--engine", "ray"], "--engine ray needs --workers N"),
    (["--engine", "ray", "--workers", "0"], "--engine ray needs --workers N"),
    (["--engine", "ray", "--workers", "2", "--framework", "tf", "--strategy", "ps"],
     "--strategy ps is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "tf", "--cluster", "tf-config"],
     "--cluster tf-config is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "tf", "--no-resume"],
     "--no-resume is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "tf", "--loader-workers", "2"],
     "--loader-workers 2 is not supported with --framework tf"),
    (["--engine", "ray", "--workers", "2", "--framework", "torch", "--replicas", "3"],
     "--replicas 3 is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "torch", "--cluster", "slurm"],
     "--cluster slurm is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "torch", "--no-resume"],
     "--no-resume is not supported with --engine ray"),
    (["--engine", "ray", "--workers", "2", "--framework", "torch", "--precision", "mixed_float16"],
     "--precision mixed_float16 is not supported with --framework torch"),
]


@pytest.mark.parametrize("argv,fragment", REFUSED)
def test_a_flag_ray_cannot_honour_is_refused_in_one_line(tmp_path, capsys, argv, fragment):
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    out = tmp_path / "run"
    code = main(["train", "--dataset", str(tmp_path / "d.npz"), *argv, "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
    assert not out.exists()


def test_under_tf_config_the_tf_ray_engine_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    code = main(["train", "--dataset", "builtin:digits", "--engine", "ray", "--workers", "2", "--framework", "tf",
                 "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--engine ray is not supported under TF_CONFIG" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_under_torchrun_the_ray_engine_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    code = main(["train", "--dataset", str(tmp_path / "d.npz"), "--engine", "ray", "--workers", "2", "--framework",
                 "torch", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--engine ray is not supported under torchrun" in err and len(err.splitlines()) == 1, err
