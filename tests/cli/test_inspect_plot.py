"""``evenflow inspect --plot``: a PNG of the per-replica loads, or one line naming a path it cannot write."""
from __future__ import annotations

import pytest

from evenflow.cli import main

pytest.importorskip("matplotlib")

ARGS = ["inspect", "--samples", "1000", "--replicas", "4", "--batch-size", "64"]


def test_the_plot_is_a_png_and_nothing_else_is_left(tmp_path, capsys):
    assert main([*ARGS, "--plot", str(tmp_path / "plan.png")]) == 0
    assert f"plot written to {tmp_path / 'plan.png'}" in capsys.readouterr().out
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"]


@pytest.mark.parametrize("name, fragment", [
    ("", "is a folder; pass the PNG file to write, e.g. "),
    ("missing/plan.png", "missing does not exist; create it or pass another path"),
    ("plan.txt", "the plot is a PNG image; name the file with .png"),
])
def test_a_path_that_cannot_be_the_plot_stops_inspect_before_it_plans(tmp_path, capsys, name, fragment):
    assert main([*ARGS, "--plot", str(tmp_path / name) if name else str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert fragment in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []
