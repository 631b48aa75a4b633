"""``evenflow report``'s page, checked as a rendering: self-contained, every chart there and drawn.

Each chart is rasterised by resvg (an SVG renderer in a small wheel, no system libraries) with the
page's own stylesheet: the PNG must decode, have the chart's size, not be blank, and show every
series in its colour, also where the replicas' loads are equal and their lines coincide; each
epoch's start is a grey line with its "epoch k" label drawn above the plot. Where PyQt6-WebEngine is installed (a Chromium; not in the ``dev`` extra: it
is hundreds of MB and needs system libraries a clean machine may lack), the whole page is also
screenshotted by that browser, headless.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

from evenflow.report.run_report import write_report
from tests.report.test_run_report import R, _balanced, _step, _straggling, _write

CHART_TITLES = ["per-replica load per step (samples)", "per-replica compute seconds per step",
                "step imbalance: max / mean compute", "input-wait fraction per step"]


class _Page(HTMLParser):
    """Tags, every attribute value, the stylesheet and each ``<svg>...</svg>`` source of a page."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.values, self.css = [], [], ""
        self._in_style = False
        self.feed(text)
        self.close()
        self.svgs = re.findall(r"<svg\b.*?</svg>", text, re.S)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.values += [v for _, v in attrs if v]
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.css += data


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("render") / "run"
    event = {"kind": "rebalance", "epoch": 0, "step": 10, "global_step": 10, "before": [1.0] * R,
             "after": [1, 1, 0.5, 1], "speeds": [8, 8, 4, 8], "imbalance_before": 1.6, "imbalance_after": 1.0}
    _write(run_dir, [*_straggling(10), event, *_balanced(40, start=10, input_wait=0.05)])
    path, _ = write_report(run_dir)
    return path, path.read_text(encoding="utf-8")


def _rgb(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])


def _pixels_near(img: np.ndarray, color: np.ndarray, tol: int = 40) -> int:
    return int((np.abs(img[..., :3].astype(int) - color).max(axis=-1) <= tol).sum())


def test_page_parses_references_nothing_outside_and_holds_every_chart(page):
    _, text = page
    doc = _Page(text)
    assert {"script", "link", "img", "iframe", "object"}.isdisjoint(doc.tags)
    assert not [v for v in doc.values if re.match(r"\s*(https?:|//|file:)", v)]  # no src/href to fetch
    assert not re.search(r"url\(|@import|@font-face", doc.css)
    assert len(doc.svgs) == 4 and all(f"<title>{t}</title>" in s for t, s in zip(CHART_TITLES, doc.svgs))
    assert doc.tags.count("polyline") >= R + R + 1 + 1  # a line per replica in two charts, one in the others


def test_every_chart_renders_to_a_non_blank_image_with_its_series_drawn(page):
    resvg = pytest.importorskip("resvg_py", reason="resvg-py is in the dev extra: pip install -e '.[dev]'")
    from PIL import Image

    _, text = page
    doc = _Page(text)
    for svg in doc.svgs:
        width, height = (int(re.search(rf'\b{k}="(\d+)"', svg)[1]) for k in ("width", "height"))
        png = bytes(resvg.svg_to_bytes(svg_string=svg, style_sheet=doc.css, background="#ffffff"))
        img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert img.shape == (height, width, 3)
        assert img.std() > 10  # not blank
        strokes = set(re.findall(r'<polyline points="[^"]+" fill="none" stroke="(#[0-9a-f]{6})"', svg))
        drawn = {c: _pixels_near(img, _rgb(c), tol=80) for c in strokes}  # anti-aliased 1.3 px lines
        assert strokes and min(drawn.values()) >= 30, drawn  # every series: at least its legend swatch (20 x 2 px)
        assert sum(drawn.values()) > 300 + 40 * len(strokes), drawn  # and its line (lines may overlap each other)
        assert _pixels_near(img, _rgb("#d62728"), tol=70) > 100  # the dashed red rebalance marker (anti-aliased)


_SHOT = """
import sys
from PyQt6.QtCore import QSize, QTimer, QUrl
from PyQt6.QtWebEngineWidgets import QWebEngineView
from PyQt6.QtWidgets import QApplication
app = QApplication(sys.argv)
view = QWebEngineView()
view.resize(QSize(1100, 2400))
view.loadFinished.connect(lambda ok: QTimer.singleShot(500, lambda: (view.grab().save(sys.argv[2]), app.quit())))
view.setUrl(QUrl.fromLocalFile(sys.argv[1]))
view.show()
QTimer.singleShot(30000, app.quit)
app.exec()
"""


def test_a_headless_browser_draws_the_page(page, tmp_path):
    pytest.importorskip("PyQt6.QtWebEngineWidgets", reason="no headless browser here (PyQt6-WebEngine)")
    from PIL import Image

    path, _ = page
    shot = tmp_path / "page.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QTWEBENGINE_CHROMIUM_FLAGS="--no-sandbox --disable-gpu")
    subprocess.run([sys.executable, "-c", _SHOT, str(path), str(shot)], env=env, timeout=60, capture_output=True)
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape == (2400, 1100, 3) and img.std() > 10
    drawn = {c: _pixels_near(img, _rgb(c)) for c in ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728")}
    assert min(drawn.values()) >= 30 and sum(drawn.values()) > 1000, drawn  # the replicas' lines and markers


# Two epochs of 25 steps, every replica given the same 8 samples a step (their load lines coincide),
# no costs; step k takes 0.5 + 0.02 k seconds: 49.5 s in all, 990 ms a step on average.
EPOCH_STEPS, STEPS = 25, 50


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("render") / "run"
    _write(run_dir, [_step(i, [0.3, 0.3, 0.45, 0.3], step_seconds=0.5 + 0.02 * i, epoch=i // EPOCH_STEPS,
                           step=i % EPOCH_STEPS) for i in range(STEPS)])
    path, _ = write_report(run_dir)
    return _Page(path.read_text(encoding="utf-8")), path.read_text(encoding="utf-8")


def _font():
    """DejaVu Sans from matplotlib's own files (the dev extra), so text is drawn on any machine."""
    pytest.importorskip("resvg_py", reason="resvg-py is in the dev extra: pip install -e '.[dev]'")
    font_manager = pytest.importorskip("matplotlib.font_manager", reason="matplotlib is in the dev extra")
    return font_manager.findfont("DejaVu Sans", fallback_to_default=False)


def _render(svg: str, css: str) -> np.ndarray:
    """The chart as a person sees it, RGB ``[h, w, 3]``; standalone, an SVG needs the namespace that
    inline in HTML it takes from the page."""
    import resvg_py
    from PIL import Image

    svg = svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    png = resvg_py.svg_to_bytes(svg_string=svg, style_sheet=css, background="#ffffff", skip_system_fonts=True,
                                font_files=[_font()], font_family="DejaVu Sans", sans_serif_family="DejaVu Sans")
    return np.asarray(Image.open(io.BytesIO(bytes(png))).convert("RGB"))


def _frame(svg: str) -> tuple[int, int, int, int]:
    """The plot area's ``x, y, width, height``."""
    return tuple(int(float(v)) for v in re.search(
        r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" class="frame"', svg).groups())


def test_every_replica_shows_in_its_own_colour_where_their_loads_coincide(two_epochs):
    doc, text = two_epochs
    svg = doc.svgs[0]
    x, y, w, h = _frame(svg)
    plot = _render(svg, doc.css)[y + 2:y + h - 1, x + 2:x + w - 1]  # the lines only: no legend, no frame
    legend = re.findall(r'stroke="(#[0-9a-f]{6})" stroke-width="3"/><text[^>]*>(replica \d+)<', svg)
    assert [name for _, name in legend] == [f"replica {r}" for r in range(R)]
    colours = {c for c, _ in legend}
    assert len(colours) == R and "#d62728" not in colours  # four colours, none the rebalance markers' red
    seen = {name: _pixels_near(plot, _rgb(c), tol=60) for c, name in legend}
    assert min(seen.values()) >= 100, seen  # each replica's dashes along the whole run, not only the top line
    assert "all 4 replicas had equal loads at every update" in text and "interleaved dashes" in text


def test_each_epoch_start_is_a_line_labelled_with_its_epoch_from_0(two_epochs):
    doc, _ = two_epochs
    for svg in doc.svgs:  # every per-step chart
        x, y, w, h = _frame(svg)
        img = _render(svg, doc.css)
        lines = [float(v) for v in re.findall(r'<line x1="([\d.]+)"[^>]*class="epoch"', svg)]
        assert len(lines) == 1, lines  # epoch 1's start; epoch 0 starts at the left edge
        bx = round(lines[0])
        assert bx == pytest.approx(x + (EPOCH_STEPS - 0.5) / (STEPS - 1) * w, abs=1)  # between updates 24 and 25
        column = img[y + 1:y + h - 1, bx - 1:bx + 2]
        grey = int((np.abs(column.astype(int) - 0x99).max(-1) <= 40).any(1).sum())
        assert grey >= 0.8 * (h - 2), (grey, h)  # drawn from top to bottom, under the data lines
        labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="tick epoch-label">([^<]*)<', svg)
        assert [t for _, t in labels] == ["epoch 0", "epoch 1"]
        for lx, _ in labels:  # each label drawn: dark glyph pixels above the plot, right of its line
            box = img[y - 16:y - 1, int(float(lx)):int(float(lx)) + 48]
            assert (box.max(-1) < 140).sum() >= 40


def test_the_page_names_mean_and_total_step_time_and_has_no_cost_column_without_costs(two_epochs):
    _, text = two_epochs
    facts = dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", text))
    assert facts["mean step time"] == "990 ms per step"  # 49.5 s / 50
    assert facts["total step time"] == f"49.5 s over {STEPS} steps"
    assert "step time" not in facts  # no bare figure to mistake the total for a step's
    headers = re.findall(r"<th>([^<]*)</th>", text)
    assert "samples" in headers and "cost" not in headers and "load unit" in facts and facts["load unit"] == "samples"
