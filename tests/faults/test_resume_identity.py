"""A run directory resumes only the same data: content, keys, shape and split are in its checkpoints' digest."""
from __future__ import annotations

import json

import numpy as np
import pytest

from evenflow.cli import main

pytest.importorskip("torch")


def _arrays(seed: int, n: int = 120):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32) + y[:, None]
    return x, y


def _train(tmp_path, capsys, dataset, *extra, epochs=1):
    code = main(["train", "--framework", "torch", "--dataset", str(dataset), "--epochs", str(epochs),
                 "--global-batch-size", "16", "--loader-workers", "0", "--output-dir", str(tmp_path / "run"), *extra])
    captured = capsys.readouterr()
    return code, captured.err.strip()


@pytest.mark.parametrize("change", ["features", "split_seed", "label_key"])
def test_other_data_with_the_same_labels_is_refused(tmp_path, capsys, change):
    x, y = _arrays(1)
    np.savez(tmp_path / "a.npz", x=x, y=y, other=y)
    code, err = _train(tmp_path, capsys, tmp_path / "a.npz")
    assert code == 0, err
    before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    if change == "features":  # random features, the same labels: N, labels and the plan all agree
        np.savez(tmp_path / "a.npz", x=_arrays(2)[0], y=y, other=y)
        extra = ()
    elif change == "split_seed":
        extra = ("--split-seed", "3")
    else:
        extra = ("--label-key", "other")  # the same values under another key: other data all the same
    code, err = _train(tmp_path, capsys, tmp_path / "a.npz", *extra, epochs=2)
    if change == "label_key":
        assert code == 0, err  # identical labels under another name: the same data, resumed
        return
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "holds checkpoints trained on other data" in err and "--no-resume" in err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before  # nothing touched


def test_the_same_data_resumes_and_the_summary_names_it(tmp_path, capsys):
    x, y = _arrays(1)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    assert _train(tmp_path, capsys, tmp_path / "a.npz")[0] == 0
    first = json.loads((tmp_path / "run" / "summary.json").read_text())["data_identity"]
    assert _train(tmp_path, capsys, tmp_path / "a.npz", epochs=2)[0] == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": 1, "step": 0} and summary["data_identity"] == first


def test_records_with_one_record_rewritten_are_other_data(tmp_path):
    from evenflow.data import convert, load_dataset
    from evenflow.run.config import load_config

    x, y = _arrays(1)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    x[7] += 1.0
    np.savez(tmp_path / "b.npz", x=x, y=y)
    convert(str(tmp_path / "a.npz"), tmp_path / "ra", label_key="y")
    convert(str(tmp_path / "b.npz"), tmp_path / "rb", label_key="y")
    ident = [load_dataset(load_config(overrides={"dataset": str(tmp_path / d), "label_key": "y"}).data).identity
             for d in ("ra", "rb", "ra")]
    assert ident[0] == ident[2] and ident[0] != ident[1]  # one changed record changes its CRC, hence the digest
