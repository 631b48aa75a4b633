"""`evenflow train --test-fraction 0` and `--eval-dataset`; `evenflow audit --locate`; the keys summary.json records.

Bad input is checked in this process (exit 2, one line, nothing written): an evaluation
dataset that is missing or does not fit the training data, a held-out split together with an
evaluation dataset, a resume with another evaluation dataset. Three real runs (TensorFlow in
fresh processes, one PyTorch process) train on every sample: without evaluation, with an
evaluation dataset, and with PyTorch; the records run's audit ids are traced to (file, record)
and checked by reading that record from the shard file.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from evenflow.data import load_dataset
from evenflow.plan.cursor import Cursor
from evenflow.records import decode_example, infer_specs
from evenflow.run.config import load_config
from tests._warm import warm_python
from tests.records.records_helpers import flip_payload_byte

pytest.importorskip("sklearn")
SRC = Path(__file__).resolve().parents[2] / "src"


def _cli(*argv, timeout=240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    # TensorFlow's commands start warm (tests/_warm.py); PyTorch's in a process without TensorFlow.
    python = [sys.executable] if "torch" in argv else warm_python(env)
    cmd = ["timeout", "-k", "5", str(timeout), *python, "-m", "evenflow", *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode != 124, f"evenflow {' '.join(argv)} did not finish within {timeout} s"
    return proc


def _bad(tmp_path, capsys, *argv) -> str:
    """Exit 2 with one line, and no run directory."""
    out = tmp_path / "out"
    code = main(["train", *argv, "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("evenflow train: error: "), err
    assert not out.exists()
    return err


def _digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Digits as 32x32 PNG records (keys image/label), as .npz arrays, and evaluation sets of them."""
    root = tmp_path_factory.mktemp("evaldata")
    assert main(["convert", "builtin:digits", str(root / "png"), "--shards", "3", "--image-format", "png"]) == 0
    x, y = _digits()
    np.savez(root / "train.npz", feat=x[:1200], lab=y[:1200])
    np.savez(root / "val.npz", feat=x[1200:1500], lab=y[1200:1500])
    np.savez(root / "val2.npz", feat=x[1500:], lab=y[1500:])
    np.savez(root / "wide.npz", feat=np.zeros((40, 8, 9), np.float32), lab=np.arange(40) % 10)
    np.savez(root / "classes.npz", feat=x[:40], lab=np.arange(40) % 12)  # labels 10 and 11: no model output
    np.savez(root / "digits_val.npz", x=x[:250, :, :, None], y=y[:250])  # builtin:digits' shape (8, 8, 1)
    return {"root": root, "png": root / "png", **{k: root / f"{k}.npz" for k in
                                                   ("train", "val", "val2", "wide", "classes", "digits_val")}}


def _npz(data, *argv) -> list[str]:
    return ["--dataset", str(data["train"]), "--feature-key", "feat", "--label-key", "lab", *argv]


# -- refused before anything starts -------------------------------------------------------------------
def test_bad_evaluation_datasets_exit_2_with_one_line(tmp_path, capsys, data):
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", str(tmp_path / "nowhere.npz")))
    assert "evaluation dataset (--eval-dataset)" in err and "nowhere.npz does not exist" in err
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", str(tmp_path / "no-records")))
    assert "evaluation dataset (--eval-dataset)" in err and "no-records" in err
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", str(data["wide"])))
    assert f"{data['wide']} has per-sample features of shape (8, 9)" in err
    assert f"the training data {data['train']} has (8, 8)" in err
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", str(data["classes"])))
    assert f"{data['classes']} has labels up to 11" in err and f"{data['train']} has 10 classes (0..9)" in err
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", "builtin:digits"))
    assert "builtin:digits has per-sample features of shape (8, 8, 1)" in err  # a builtin has no keys to pass


def test_evaluation_classes_must_have_the_training_names(tmp_path, capsys, data):
    from PIL import Image
    for name in ("cat", "dog"):  # 32x32 grey images, like the PNG digits, of classes named otherwise
        (tmp_path / "pets" / name).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((32, 32), 40 * i, np.uint8), mode="L").save(tmp_path / "pets" / name / f"{i}.png")
    assert main(["convert", str(tmp_path / "pets"), str(tmp_path / "pets-rec")]) == 0
    err = _bad(tmp_path, capsys, "--dataset", str(data["png"]), "--eval-dataset", str(tmp_path / "pets-rec"))
    assert "names label 0 'cat', but the training data" in err and "names it '0'" in err


def test_a_split_and_an_evaluation_dataset_are_refused_together(tmp_path, capsys, data):
    err = _bad(tmp_path, capsys, *_npz(data, "--eval-dataset", str(data["val"]), "--test-fraction", "0.1"))
    assert err.startswith("evenflow train: error: --test-fraction: test_fraction 0.1 holds out part of --dataset")
    assert "drop --test-fraction" in err and "drop --eval-dataset" in err
    err = _bad(tmp_path, capsys, *_npz(data, "--test-fraction", "0", "--split-seed", "3"))
    assert "--split-seed: split_seed 3 chooses the held-out test samples, and test_fraction 0 holds out none" in err
    # In a TOML file, an eval dataset alone makes test_fraction 0; a flag still wins over the file.
    (tmp_path / "run.toml").write_text(f'dataset = "{data["train"]}"\neval_dataset = "{data["val"]}"\n')
    assert load_config(tmp_path / "run.toml").data.test_fraction == 0.0
    config = load_config(tmp_path / "run.toml", overrides={"eval_dataset": ""})
    assert (config.data.test_fraction, config.data.eval_dataset) == (0.2, "")


# -- real runs ------------------------------------------------------------------------------------------
def _frame(path: Path, record: int) -> tuple[int, bytes]:
    """(offset, data) of record number ``record`` of a TFRecord file, found by walking its frames."""
    raw = path.read_bytes()
    pos = 0
    for _ in range(record):
        pos += struct.unpack_from("<Q", raw, pos)[0] + 16
    n = struct.unpack_from("<Q", raw, pos)[0]
    return pos, raw[pos + 12:pos + 12 + n]


def _check_located(run: Path, dataset: Path, ids: list[int]) -> None:
    """`evenflow audit RUN --locate` names, for each id, the record that training read as that sample."""
    from PIL import Image
    proc = _cli("audit", str(run), "--locate", ",".join(map(str, ids)), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["locations"]
    train = load_dataset(load_config(overrides={"dataset": str(dataset), "test_fraction": 0.0,
                                                "skip_corrupt": True}).data).train
    assert [r["id"] for r in rows] == ids
    for row in rows:
        offset, record = _frame(Path(row["file"]), row["record"])
        assert offset == row["offset"]
        example = decode_example(record, infer_specs(record))
        pixels = np.asarray(Image.open(io.BytesIO(example["image"])), np.float32) / 255
        sample = train.batch(np.array([row["id"]]))
        np.testing.assert_allclose(sample["features"][0, ..., 0], pixels, atol=1e-6)
        assert int(sample["label"][0]) == int(example["label"])


def _events(run: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (run / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_training_on_every_record_without_evaluation_and_locating_audit_ids(tmp_path, data):
    png = tmp_path / "png"
    shutil.copytree(data["png"], png)
    flip_payload_byte(png, 1, 7)  # left out with --skip-corrupt: later records of shard 1 keep their numbers
    run = tmp_path / "all"
    proc = _cli("train", "--dataset", str(png), "--test-fraction", "0", "--skip-corrupt", "--epochs", "1",
                "--replicas", "2", "--audit", "--output-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no evaluation: training on every sample" in proc.stdout and "test accuracy" not in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluation"] is None and summary["test_accuracy"] is None and summary["test_loss"] is None
    assert summary["test_samples"] == 0 and summary["split"]["test"] == 0 and summary["split"]["train"] == 1796
    assert (summary["config"]["feature_key"], summary["config"]["label_key"]) == ("image", "label")
    assert b"train/loss" in _events(run) and b"test/accuracy" not in _events(run)
    assert main(["audit", str(run)]) == 0  # the exactly-once check as ever
    start = 599  # shard 0 holds records 0..598; shard 1's record 7 is corrupt, so id 599 + 7 is its record 8
    _check_located(run, png, [0, 598, start + 6, start + 7, 1795])
    rows = json.loads(_cli("audit", str(run), "--locate", str(start + 7), "--json").stdout)["locations"]
    assert rows[0]["record"] == 8 and rows[0]["file"].endswith("-00001-of-00003.tfrecord")
    assert _cli("report", str(run)).returncode == 0
    assert "none: every sample was trained on" in (run / "report.html").read_text()


@pytest.mark.slow
def test_an_evaluation_dataset_is_evaluated_and_a_resume_with_another_one_refused(tmp_path, capsys, data):
    run = tmp_path / "val"
    proc = _cli("train", *_npz(data, "--eval-dataset", str(data["val"]), "--epochs", "2", "--replicas", "2"),
                "--output-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"evaluating on the evaluation dataset {data['val']}: 300 samples" in proc.stdout
    assert "(300/300 of the evaluation dataset, each counted once)" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluation"] == {"on": "eval_dataset", "dataset": str(data["val"]), "samples": 300}
    assert summary["test_samples"] == 300 and 0.5 < summary["test_accuracy"] <= 1.0
    assert summary["split"]["train"] == 1200 and summary["config"]["test_fraction"] == 0.0
    assert (summary["config"]["feature_key"], summary["config"]["label_key"]) == ("feat", "lab")
    assert b"test/accuracy" in _events(run)
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    for other in (["--eval-dataset", str(data["val2"])], ["--test-fraction", "0"]):
        code = main(["train", *_npz(data, *other, "--epochs", "3", "--replicas", "2"), "--output-dir", str(run)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "holds checkpoints trained on other data" in err, err
        assert "the evaluation dataset" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    from evenflow.run.job import prepare
    from evenflow.tf.adapter import TensorFlow
    config = load_config(overrides={"dataset": str(data["train"]), "feature_key": "feat", "label_key": "lab",
                                    "eval_dataset": str(data["val"]), "epochs": 3, "replicas": 2,
                                    "output_dir": str(run)})
    assert prepare(config, TensorFlow()).resume_from == Cursor(2, 0)  # the same evaluation dataset resumes


@pytest.mark.slow
def test_torch_trains_on_every_sample_and_evaluates_the_evaluation_dataset(tmp_path, data):
    pytest.importorskip("torch")
    run = tmp_path / "torch"
    proc = _cli("train", "--framework", "torch", "--dataset", "builtin:digits", "--eval-dataset",
                str(data["digits_val"]), "--epochs", "1", "--output-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluation"] == {"on": "eval_dataset", "dataset": str(data["digits_val"]), "samples": 250}
    assert summary["test_samples"] == 250 and summary["test_accuracy"] > 0.5
    assert summary["split"]["train"] == 1797 and summary["framework"] == "torch"
    assert (summary["config"]["feature_key"], summary["config"]["label_key"]) == (None, None)  # a builtin: none


def test_locate_refuses_bad_ids_and_a_changed_id_map(tmp_path, capsys, data):
    from evenflow.run.audit_ids import ID_MAP, write_id_map
    loaded = load_dataset(load_config(overrides=dict(dataset=str(data["train"]), feature_key="feat",
                                                     label_key="lab")).data)
    path = write_id_map(tmp_path, loaded, str(data["train"]))
    assert main(["audit", str(tmp_path), "--locate", "0,959", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["locations"]
    assert [r["id"] for r in rows] == [0, 959]
    with np.load(data["train"]) as z:  # the row of train.npz that training read as each sample of its split
        for r in rows:
            np.testing.assert_array_equal(loaded.train.batch(np.array([r["id"]]))["features"][0],
                                          z["feat"][r["dataset_id"]])
    assert main(["audit", str(tmp_path), "--locate", "959"]) == 0
    assert "dataset index" in capsys.readouterr().out
    for ids, fragment in (("960", "has samples 0..959"), ("3,x", "comma-separated"), ("-1", "comma-separated"),
                          ("3 --limit 5", "drop --limit")):
        assert main(["audit", str(tmp_path), "--locate", *ids.split()]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and fragment in err, err
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["dataset_ids"] = arrays["dataset_ids"][::-1].copy()
    np.savez(path, **arrays)
    assert main(["audit", str(tmp_path), "--locate", "0"]) == 2
    assert f"{tmp_path / 'audit' / ID_MAP}: its checksum does not match" in capsys.readouterr().err
    (tmp_path / "elsewhere").mkdir()  # a run directory without the id map
    assert main(["audit", str(tmp_path / "elsewhere"), "--locate", "0"]) == 2
    assert "train with --audit to write it" in capsys.readouterr().err
