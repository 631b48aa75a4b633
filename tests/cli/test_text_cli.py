"""`evenflow inspect --dataset builtin:stdlib-docs`, the CLI's checks for text data (in this process), and
`evenflow train` on text records and with `--pad-lengths` (training runs in fresh processes, like
tests/cli/test_records_train.py, since TensorFlow fixes its logical devices once per process)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from evenflow.cli import main
from tests._warm import warm_python

SRC = Path(__file__).resolve().parents[2] / "src"
# Small and quick: 2 replicas, 1 epoch of 5136 docstrings in 21 steps of 256.
TEXT_RUN = ("--model", "text_cnn", "--balance", "cost", "--bucket", "--epochs", "1", "--replicas", "2",
            "--global-batch-size", "256", "--no-telemetry")


def test_inspect_dataset_shows_tokens_per_mode(capsys):
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "4", "--batch-size", "64",
                 "--balance", "cost", "--bucket", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    modes = {row["mode"]: row for row in summary["modes"]}
    assert list(modes) == ["count", "count+bucket", "cost", "cost+bucket", "pack 512"]  # the longest docstring
    # The same real tokens in every unpacked mode; bucketing pads far less than random steps, packing least.
    assert len({round(row["tokens_per_replica_step"], 6) for name, row in modes.items() if name != "pack 512"}) == 1
    assert modes["pack 512"]["token_efficiency"] > modes["cost+bucket"]["token_efficiency"]
    assert modes["cost+bucket"]["token_efficiency"] > 2 * modes["count"]["token_efficiency"]
    assert summary["real_samples"] == sum(r["real"] for r in summary["per_replica"]) > 1000
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "4", "--batch-size", "64"]) == 0
    table = capsys.readouterr().out
    assert "tokens per replica per step" in table and "cost+bucket" in table


def test_inspect_a_packed_plan(capsys):
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "2", "--batch-size", "20",
                 "--pack", "512", "--balance", "cost", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pack_length"] == 512 and summary["rows"] == 10
    assert summary["token_efficiency"] >= 0.98 and summary["imbalance_mean"] <= 1.02
    packed = summary["modes"][-1]
    assert packed["mode"] == "pack 512" and packed["padded_per_replica_step"] == 10 * 512
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "2", "--batch-size", "20",
                 "--pack", "512"]) == 0
    assert "packed: 10 rows of 512 tokens per replica batch" in capsys.readouterr().out
    # Longer samples than the pack: refused with the fix, or split on request.
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "2", "--batch-size", "20",
                 "--pack", "100"]) == 2
    err = capsys.readouterr().err
    assert "longer than the pack length 100" in err and "--pack-overflow split" in err
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "2", "--batch-size", "40",
                 "--pack", "100", "--pack-overflow", "split", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["real_samples"] > 6000 and summary["token_efficiency"] >= 0.98


def test_text_dataset_errors_are_one_line(capsys, tmp_path):
    assert main(["inspect", "--dataset", "builtin:nope", "--replicas", "4", "--batch-size", "64"]) == 2
    assert "builtin:stdlib-docs" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train", "--dataset", "builtin:stdlib-docs", "--model", "mlp", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "use model 'text_cnn'" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["train", "--dataset", "builtin:stdlib-docs", "--balance", "size", "--output-dir", str(out)]) == 2
    assert "balance must be one of cost, count" in capsys.readouterr().err


@pytest.fixture(scope="module")
def docs_records(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text") / "docs"
    assert main(["convert", "builtin:stdlib-docs", str(out)]) == 0
    return out


def _expected_test_samples() -> int:
    from evenflow.data import split_indices, stdlib_docs
    return len(split_indices(stdlib_docs().labels, 0.2, 0)[1])  # the defaults test_fraction 0.2, split_seed 0


def _start(*argv) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen([*warm_python(env), "-m", "evenflow", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{' '.join(proc.args)} did not finish within {timeout} s")
    assert proc.returncode == 0, err[-3000:]
    return out


def test_train_text_cnn_from_records_matches_the_builtin(tmp_path, docs_records):
    # Both runs at once (one core each): the records' bytes, read by plan id, must become the very
    # batches the builtin's ragged tensor gives, so with --deterministic the results are bitwise equal.
    runs = {"records": docs_records, "builtin": "builtin:stdlib-docs"}
    procs = {k: _start("train", "--dataset", str(d), *TEXT_RUN, "--deterministic", "--output-dir",
                       str(tmp_path / k)) for k, d in runs.items()}
    outs = {k: _finish(p) for k, p in procs.items()}
    assert "(text, 2-512 tokens" in outs["records"] and "padded per batch" in outs["records"]
    got = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in runs}
    expected = _expected_test_samples()
    assert got["records"]["test_samples"] == got["builtin"]["test_samples"] == expected > 1000
    assert got["records"]["plan"] == got["builtin"]["plan"]  # the same costs, so the same bucketed plan
    for key in ("test_accuracy", "test_loss", "final_train_loss"):
        assert got["records"][key] == got["builtin"][key], key
    assert got["records"]["test_accuracy"] > 0.3  # 9 classes: it learned something in one epoch


def test_pad_lengths_flag_and_toml_key(tmp_path, capsys, docs_records):
    def bad(*argv) -> str:
        out = tmp_path / "bad"
        assert main(["train", *argv, "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("evenflow train: error: ") and not out.exists(), err
        return err

    text = ("--dataset", str(docs_records), "--model", "text_cnn")
    assert "where 32 follows 64" in bad(*text, "--pad-lengths", "64,32")
    assert "where 128 follows 128" in bad(*text, "--pad-lengths", "64,128,128,512")
    assert "where 0 is not positive" in bad(*text, "--pad-lengths", "0,512")
    assert "where '1.5' is not an integer" in bad(*text, "--pad-lengths", "1.5,512")
    # The longest docstring has 512 tokens: the last length must hold it, records and builtin alike.
    for dataset in (str(docs_records), "builtin:stdlib-docs"):
        err = bad("--dataset", dataset, "--model", "text_cnn", "--pad-lengths", "64,128,256")
        assert "must reach the longest sequence (512 tokens), but the last is 256; append 512" in err
    assert "only applies to variable-length text" in bad("--dataset", "builtin:digits", "--pad-lengths", "64,128")
    toml = tmp_path / "bad.toml"
    toml.write_text('pad_lengths = [64, -1]\n')
    assert "bad.toml: pad_lengths must be a comma list" in bad("--config", str(toml), *text)

    # The TOML key takes an array; the run pads every batch to 64, 128, 256 or 512 tokens.
    toml = tmp_path / "run.toml"
    toml.write_text(f'dataset = "{docs_records}"\npad_lengths = [64, 128, 256, 512]\n'
                    f'output_dir = "{tmp_path / "run"}"\n')
    out = _finish(_start("train", "--config", str(toml), *TEXT_RUN))
    assert "padded to 64,128,256,512" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["pad_lengths"] == "64,128,256,512"
    assert summary["test_samples"] == _expected_test_samples() and summary["test_accuracy"] > 0.3
