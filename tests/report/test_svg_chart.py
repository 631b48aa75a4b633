"""The inline SVG line chart's drawing rules and the words on coinciding replicas, on their own."""
from __future__ import annotations

import re

import numpy as np

from evenflow.report.coincide import coincidence_note
from evenflow.report.svg_chart import svg_line_chart


def _chart(series, **kw):
    return svg_line_chart(series, title="t", xlabel="x", ylabel="y", **kw)


def test_lines_that_coincide_in_part_are_dashed_there_only_and_in_turn():
    x = np.arange(6.0)
    a, b = np.array([1, 1, 1, 2, 3, 4.0]), np.array([1, 1, 1, 5, 6, 7.0])  # equal over updates 0..2
    svg = _chart([("a", x, a), ("b", x, b)])
    lines = re.findall(r'<polyline points="([^"]*)" fill="none" stroke="(#\w+)" ([^>]*)>', svg)
    dashed = [(pts, colour, look) for pts, colour, look in lines if "dasharray" in look]
    solid = [(pts, colour) for pts, colour, look in lines if "dasharray" not in look]
    assert len(dashed) == 2 and dashed[0][0] == dashed[1][0] and len(dashed[0][0].split()) == 3  # the shared run
    assert {d[1] for d in dashed} == {s[1] for s in solid} and len({d[1] for d in dashed}) == 2
    offsets = sorted(int(re.search(r'dashoffset="(\d+)"', d[2])[1]) for d in dashed)
    assert all('stroke-dasharray="6 6"' in d[2] for d in dashed) and offsets == [0, 6]  # alternate dashes
    assert all(len(pts.split()) == 4 for pts, _ in solid)  # each one's own run, from the last shared point on


def test_crowded_epoch_labels_are_thinned_so_none_overlaps():
    x = np.arange(1000.0)
    epochs = [(0.0, 0)] + [(k * 10 - 0.5, k) for k in range(1, 100)]
    svg = _chart([("a", x, np.ones(1000))], epochs=epochs)
    xs = [float(v) for v in re.findall(r'<text x="([\d.]+)"[^>]*epoch-label">epoch \d+<', svg)]
    assert xs[0] == 67.0 and 8 <= len(xs) < 100 and min(np.diff(xs)) >= 64
    assert len(re.findall(r'class="epoch"', svg)) == 99  # every start after the first still has its line


def test_the_note_names_the_replicas_that_were_equal_and_how_often():
    y = np.array([[8, 8, 8, 8], [8, 8, 7, 7], [8, 8, 8, 8]])
    assert coincidence_note(y, "loads", 16) == (
        "replicas 0 and 1 had equal loads at every update, as had replicas 2 and 3; all 4 replicas had equal "
        "loads at 2 of 3 updates; where lines coincide they are drawn in interleaved dashes, one colour per replica")
    assert coincidence_note(np.full((3, 4), 8), "loads", 16).startswith("all 4 replicas had equal loads at every")
    assert coincidence_note(np.array([[1, 2], [3, 4.0]]), "loads", 16) == ""  # no line covers another
    assert coincidence_note(np.full((2, 20), 8), "loads", 16).startswith("all 20 replicas had equal loads at 2 of 2")
