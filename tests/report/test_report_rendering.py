"""``evenflow report``'s page, checked as a rendering: self-contained, every chart there and drawn.

Each chart is rasterised by resvg (an SVG renderer in a small wheel, no system libraries) with the
page's own stylesheet: the PNG must decode, have the chart's size, not be blank, and show every
series in its colour. Where PyQt6-WebEngine is installed (a Chromium; not in the ``dev`` extra: it
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
from tests.report.test_run_report import R, _balanced, _straggling, _write

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
    drawn = {c: _pixels_near(img, _rgb(c)) for c in ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")}
    assert min(drawn.values()) >= 30 and sum(drawn.values()) > 1000, drawn  # the replicas' lines and markers
