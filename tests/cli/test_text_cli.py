"""`evenflow inspect --dataset builtin:stdlib-docs` and the CLI's checks for text data (in this process)."""
from __future__ import annotations

import json

from evenflow.cli import main


def test_inspect_dataset_shows_tokens_per_mode(capsys):
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "4", "--batch-size", "64",
                 "--balance", "cost", "--bucket", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    modes = {row["mode"]: row for row in summary["modes"]}
    assert list(modes) == ["count", "count+bucket", "cost", "cost+bucket"]
    # The same real tokens in every mode; bucketing pads far less than random steps.
    assert len({round(row["tokens_per_replica_step"], 6) for row in modes.values()}) == 1
    assert modes["cost+bucket"]["token_efficiency"] > 2 * modes["count"]["token_efficiency"]
    assert summary["real_samples"] == sum(r["real"] for r in summary["per_replica"]) > 1000
    assert main(["inspect", "--dataset", "builtin:stdlib-docs", "--replicas", "4", "--batch-size", "64"]) == 0
    table = capsys.readouterr().out
    assert "tokens per replica per step" in table and "cost+bucket" in table


def test_text_dataset_errors_are_one_line(capsys, tmp_path):
    assert main(["inspect", "--dataset", "builtin:nope", "--replicas", "4", "--batch-size", "64"]) == 2
    assert "builtin:stdlib-docs" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train", "--dataset", "builtin:stdlib-docs", "--model", "mlp", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "use model 'text_cnn'" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["train", "--dataset", "builtin:stdlib-docs", "--balance", "size", "--output-dir", str(out)]) == 2
    assert "balance must be one of cost, count" in capsys.readouterr().err
