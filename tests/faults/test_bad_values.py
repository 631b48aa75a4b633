"""Bad values to flags and bad data: exit 2, one line naming the flag or file, the value and the fix; nothing written.

Every case runs the real ``evenflow`` entry point in this process (bad input is caught before a
framework starts, so these take milliseconds), and checks that the output directory was not
created.
"""
from __future__ import annotations

import io

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import convert
from tests.records.records_helpers import replace_image


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 5)).astype(np.float32)
    y = np.arange(60) % 3
    np.savez(root / "ok.npz", x=x, y=y)
    np.savez(root / "billion.npz", x=x, y=np.where(np.arange(60) == 7, 10**9, y))
    np.savez(root / "stray.npz", x=x, y=np.where(np.arange(60) == 7, 10**5, y))
    convert(str(root / "ok.npz"), root / "rec", label_key="y")
    meta = next((root / "rec").glob("*.meta.npz"))
    meta.write_bytes(meta.read_bytes()[:200])  # truncated
    bracket = root / "runs[1]"
    convert(str(root / "ok.npz"), bracket, label_key="y")
    return root


CASES = [
    # (flags, what the one line must hold)
    (["--dataset", "{root}/billion.npz"], "the largest is 1000000000 while only 4 distinct labels occur"),
    (["--dataset", "{root}/stray.npz"], "the largest is 100000 while only 4 distinct labels occur"),
    (["--dataset", "{root}/rec"], "cannot read the index metadata (BadZipFile"),
    (["--dataset", "{root}/ok.npz", "--simulate-sample-ms", "1e12"], "--simulate-sample-ms: simulate_sample_ms"),
    (["--dataset", "{root}/ok.npz", "--simulate-slow", "0:1e9"], "the factor must be in [1, 100]"),
    (["--dataset", "{root}/ok.npz", "--learning-rate", "inf"], "--learning-rate: learning_rate must be finite"),
    (["--dataset", "{root}/ok.npz", "--learning-rate", "nan"], "--learning-rate: learning_rate must be greater"),
    (["--dataset", "{root}/ok.npz", "--collective-timeout", "inf"], "collective_timeout must be finite"),
    (["--dataset", "builtin:digits", "--feature-key", "pixels"], "--feature-key pixels names an array"),
    (["--dataset", "builtin:digits", "--skip-corrupt"], "--skip-corrupt checks the records"),
    (["--dataset", "{root}/ok.npz", "--skip-corrupt"], "--skip-corrupt checks the records"),
    (["--dataset", "{root}/ok.npz", "--dropout", "1"], "dropout must be in [0, 1)"),
    (["--dataset", "{root}/ok.npz", "--threads", "-1"], "threads must be at least 0"),
    (["--dataset", "{root}/ok.npz", "--loader-workers", "100"], "loader_workers must be at most 64"),
    (["--dataset", "{root}/missing.npz"], "does not exist"),
    (["--dataset", "{root}/ok.npz", "--framework", "jax"], "framework must be one of tf, torch"),
]


@pytest.mark.parametrize("flags,fragment", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_values_are_one_line_and_write_nothing(data, tmp_path, capsys, flags, fragment):
    argv = ["train", "--framework", "torch", *[f.format(root=data) for f in flags],
            "--output-dir", str(tmp_path / "out")]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("evenflow train: error: ") and fragment in err, err
    assert not (tmp_path / "out").exists()


def test_a_path_with_glob_characters_is_taken_as_it_is(data, tmp_path, capsys):
    code = main(["train", "--framework", "torch", "--dataset", str(data / "runs[1]"), "--label-key", "y",
                 "--epochs", "1", "--loader-workers", "0", "--output-dir", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err


def test_inspect_refuses_a_plan_larger_than_memory(capsys):
    code = main(["inspect", "--samples", str(10**11), "--replicas", "8", "--batch-size", "256"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "planning an epoch of 100,000,000,000 samples needs" in err


def test_an_image_of_another_size_is_named_and_skip_corrupt_leaves_it_out(tmp_path, capsys):
    from PIL import Image

    root = tmp_path / "png"
    convert("builtin:digits", root, shards=2, image_format="png")

    def small(_):
        buf = io.BytesIO()
        Image.fromarray(np.zeros((16, 16), np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    offset = replace_image(root, 1, 7, small)
    base = ["train", "--framework", "torch", "--dataset", str(root), "--epochs", "1", "--loader-workers", "0"]
    assert main([*base, "--output-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"(record 7, offset {offset}): image 'image' is 16x16" in err and "--skip-corrupt" in err
    assert main([*base, "--skip-corrupt", "--output-dir", str(tmp_path / "b")]) == 0  # what the message says works
    out = capsys.readouterr().out
    assert "skipped 1 bad records" in out and "1 image_size" in out
