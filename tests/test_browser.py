"""The rendered page in a real headless chromium: it renders its matrix and charts, and the
page itself requests nothing from the network (checked in chromium's own net log)."""

from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser

import numpy as np
from matplotlib import image as mpimg

from harness.report.charts import PALETTE

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars"]


def _chromium(chromium, tmp_path, name, url, *extra) -> tuple[str, list[str]]:
    """Run chromium on ``url``; return stdout and the URLs the page itself asked the network for."""
    netlog = tmp_path / f"{name}.netlog.json"
    cmd = [chromium, *FLAGS, f"--user-data-dir={tmp_path / (name + '-profile')}", f"--log-net-log={netlog}",
           *extra, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, page_requests(netlog)


def page_requests(netlog) -> list[str]:
    """Network requests a page started (the browser's own background fetches have no origin)."""
    data = json.loads(netlog.read_text())
    start_job = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in data["events"]:
        params = event.get("params") or {}
        if event["type"] == start_job and "url" in params and params.get("initiator") != "not an origin":
            urls.append(params["url"])
    return [u for u in urls if not u.startswith(("file:", "data:"))]


class Dom(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.matrix_rows = 0
        self.matrix_cells: list[str] = []
        self.images: list[str] = []
        self._in_matrix = False
        self._classes: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "table" and "matrix" in classes:
            self._in_matrix = True
        if self._in_matrix and tag == "tr":
            self.matrix_rows += 1
        if self._in_matrix and tag == "td" and "cell" in classes:
            self.matrix_cells.append(classes[-1])
        if tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_matrix = False


def test_page_renders_matrix_and_charts_without_network(rendered, chromium, tmp_path):
    url = rendered["html_path"].as_uri()
    dom, requested = _chromium(chromium, tmp_path, "dom", url, "--dump-dom")
    assert requested == []
    parsed = Dom(dom)
    n_suites = 9
    assert parsed.matrix_rows == 1 + n_suites + 1  # header, suites, totals
    assert parsed.matrix_cells.count("bad") == 3 + 1  # three suites and the total of the failing leg
    assert len(parsed.images) >= 9 and all(src.startswith("data:image/svg+xml;base64,") for src in parsed.images)
    assert "FAILED" in dom and "incomplete run" in dom
    assert "<script" not in dom.lower()

    shot = tmp_path / "report.png"
    _, requested = _chromium(chromium, tmp_path, "shot", url, f"--screenshot={shot}", "--window-size=1400,2600")
    assert requested == []
    pixels = (mpimg.imread(shot)[..., :3] * 255).round().astype(np.int16)
    assert pixels.shape[:2] == (2600, 1400)

    def count(hex_color: str, rows=slice(None)) -> int:
        rgb = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(pixels[rows] - rgb).sum(axis=-1) <= 6).sum())

    assert count("#ffebe9", slice(0, 150)) > 20_000  # the red verdict banner at the top
    assert count("#cf222e") > 2_000  # failing matrix cells and outcome pills
    # The leg colors exist only inside the SVG charts: they were decoded and drawn.
    assert count(PALETTE[1]) > 3_000 and count(PALETTE[2]) > 3_000


def test_net_log_check_catches_an_external_request(chromium, tmp_path):
    page = tmp_path / "external.html"
    page.write_text('<!DOCTYPE html><img src="https://example.invalid/x.png">'
                    '<link rel="stylesheet" href="http://fonts.example.invalid/a.css">')
    _, requested = _chromium(chromium, tmp_path, "control", page.as_uri(), "--dump-dom")
    assert sorted(requested) == ["http://fonts.example.invalid/a.css", "https://example.invalid/x.png"]
