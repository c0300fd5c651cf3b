"""The rendered page in a real headless chromium: it renders its matrix and charts, the page
itself requests nothing from the network (checked in chromium's own net log), its wide tables fit a
1280 px window and every chart keeps its legends and labels inside its image (measured by a script
run on a copy of the page, since the page itself allows none)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from html import unescape
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
        self.trend_charts = 0
        self.tradeoff_charts = 0
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
        if tag == "figure" and "chart-trend" in classes:
            self.trend_charts += 1
        if tag == "figure" and "chart-tradeoff" in classes:
            self.tradeoff_charts += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_matrix = False


def test_page_renders_matrix_and_charts_without_network(rendered, chromium, tmp_path):
    url = rendered["html_path"].as_uri()
    dom, requested = _chromium(chromium, tmp_path, "dom", url, "--dump-dom")
    assert requested == []
    parsed = Dom(dom)
    n_suites = 10
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


VIEWPORT = 1280
# Measures the page after layout, with every <details> closed and then open: for each table, the
# right edge of its farthest-reaching element; written into the page for --dump-dom to return.
MEASURE_TABLES = """<script>
function reach(selector) {
  const table = document.querySelector(selector);
  if (!table) return null;
  return Math.max(...[table, ...table.querySelectorAll("*")].map(e => e.getBoundingClientRect().right));
}
const out = {viewport: document.documentElement.clientWidth, closed: {}, open: {}};
const tables = ["table.failing", "table.env"];
for (const t of tables) out.closed[t] = reach(t);
document.querySelectorAll("details").forEach(d => d.open = true);
for (const t of tables) out.open[t] = reach(t);
const pre = document.createElement("pre"); pre.id = "measured"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""

# For every inline chart: the marks of legends and every text that fall outside the chart's own box.
MEASURE_CHARTS = """<script>
const out = {charts: 0, legends: 0, outside: []};
document.querySelectorAll("div.chart > svg").forEach((svg, i) => {
  out.charts += 1;
  const box = svg.getBoundingClientRect();
  const parts = [...svg.querySelectorAll('g[id*="-legend_"]'), ...svg.querySelectorAll("text")];
  out.legends += svg.querySelectorAll('g[id*="-legend_"]').length;
  for (const el of parts) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
      out.outside.push([svg.parentElement.dataset.title, el.id || el.textContent, r.top - box.top, r.bottom - box.bottom]);
  }
});
const pre = document.createElement("pre"); pre.id = "measured"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _measured(chromium, tmp_path, name, html: str) -> dict:
    """``html`` with the page's no-script policy taken out and ``script`` run on it at 1280 px."""
    page = tmp_path / f"{name}.html"
    page.write_text(html, encoding="utf-8")
    dom, requested = _chromium(chromium, tmp_path, name, page.as_uri(), "--dump-dom",
                               f"--window-size={VIEWPORT},900", "--virtual-time-budget=5000")
    assert requested == []
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, flags=re.S)
    assert found, dom[-2000:]
    return json.loads(unescape(found.group(1)))


def _scripted(html: str, script: str) -> str:
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    return html.replace("</body>", script + "</body>")


def test_not_passing_and_environment_tables_fit_a_1280_px_window(rendered, chromium, tmp_path):
    measured = _measured(chromium, tmp_path, "tables", _scripted(rendered["html"], MEASURE_TABLES))
    assert measured["viewport"] == VIEWPORT
    for state in ("closed", "open"):  # folded values and failure messages unfolded too
        for table, right in measured[state].items():
            assert right is not None and right <= VIEWPORT, (state, table, right)


def test_the_table_check_catches_a_table_wider_than_the_window(chromium, tmp_path):
    page = ('<!DOCTYPE html><html><body><table class="failing"><tr><td style="white-space: nowrap">'
            + "x" * 400 + '</td></tr></table><table class="env"><tr><td>ok</td></tr></table></body></html>')
    measured = _measured(chromium, tmp_path, "control-tables", _scripted(page, MEASURE_TABLES))
    assert measured["closed"]["table.failing"] > VIEWPORT and measured["closed"]["table.env"] <= VIEWPORT


def _inline_charts(html: str) -> str:
    """Every chart of the page as inline SVG (ids made unique per chart), so a script can measure it."""
    blocks = []
    for index, (title, data) in enumerate(re.findall(
            r'<div class="ftitle">([^<]*)</div><img src="data:image/svg\+xml;base64,([^"]+)"', html)):
        svg = base64.b64decode(data).decode("utf-8")
        svg = svg[svg.index("<svg"):]
        svg = re.sub(r'(id="|url\(#|href="#)', rf"\g<1>c{index}-", svg)
        blocks.append(f'<div class="chart" data-title="{title}">{svg}</div>')
    return "<!DOCTYPE html><html><body>" + "".join(blocks) + MEASURE_CHARTS + "</body></html>"


def test_every_chart_keeps_its_legends_and_labels_inside_its_image(rendered, chromium, tmp_path):
    page = Dom(_chromium(chromium, tmp_path, "trend", rendered["html_path"].as_uri(), "--dump-dom")[0])
    assert page.trend_charts == 3  # the history's runs are drawn
    assert page.tradeoff_charts == 1 and 'id="memory-per-token"' in rendered["html"]
    measured = _measured(chromium, tmp_path, "charts", _inline_charts(rendered["html"]))
    assert measured["charts"] == len(Dom(rendered["html"]).images) and measured["legends"] >= 10
    assert measured["outside"] == []


def test_the_chart_check_catches_a_note_drawn_below_the_figure(chromium, tmp_path):
    from matplotlib.figure import Figure

    from harness.report.charts import figure_uri

    fig = Figure(figsize=(3, 2), layout="constrained")
    fig.add_subplot().plot([1, 2], [1, 2], label="a line")
    fig.axes[0].legend()
    fig.text(0.01, -0.05, "a note below the figure")
    page = f'<div class="ftitle">clipped</div><img src="{figure_uri(fig)}">'
    measured = _measured(chromium, tmp_path, "control-charts", _inline_charts(page))
    assert [item[1] for item in measured["outside"]] == ["a note below the figure"]
