"""The rendered page in a real headless chromium: it renders its matrix and charts, the page
itself requests nothing from the network (checked in chromium's own net log), its wide tables fit a
1280 px window, it never scrolls sideways in a 400 px one, every chart keeps its legends and labels
inside its image (measured by a script run on a copy of the page, since the page itself allows none)
and printed, it keeps every column of the bad-input catalogue in a few pages (read from the PDF)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import unicodedata
import zlib
from html import escape, unescape
from html.parser import HTMLParser

import numpy as np
import pytest
from matplotlib import image as mpimg
from synthetic import catalogue_records, env_for, write_legs, write_run

from harness.report import load_results, render_html, summarize, write_html
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
const tables = ["table.failing", "table.env", "table.bad-input"];
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
      out.outside.push([svg.parentElement.dataset.title, el.id || el.textContent,
                        r.top - box.top, r.bottom - box.bottom]);
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


def test_not_passing_environment_and_bad_input_tables_fit_a_1280_px_window(rendered, chromium, tmp_path):
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


NARROW = 400
# The page laid out 400 px wide, with every <details> closed and then open: the widths its document
# scrolls over and where its images end. Chromium's headless window is never narrower than 500 px,
# so the page is a 400 px frame's document (srcdoc: same origin, so the script beside it can measure).
MEASURE_NARROW = """<script>
const frame = document.getElementById("narrow");
frame.addEventListener("load", () => {
  const doc = frame.contentDocument, root = doc.documentElement;
  const widths = () => ({viewport: root.clientWidth, scroll: root.scrollWidth,
                         images: Math.max(0, ...[...doc.images].map(img => img.getBoundingClientRect().right))});
  const out = {closed: widths()};
  doc.querySelectorAll("details").forEach(d => d.open = true);
  out.open = widths();
  const pre = document.createElement("pre"); pre.id = "measured"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _framed(html: str, width: int) -> str:
    return (f'<!DOCTYPE html><html><body style="margin: 0"><iframe id="narrow" style="border: 0; width: {width}px; '
            f'height: 900px" srcdoc="{escape(html, quote=True)}"></iframe>{MEASURE_NARROW}</body></html>')


def test_a_400_px_window_never_scrolls_sideways(rendered, chromium, tmp_path):
    """Tables wrap or scroll inside their own box; charts, the error chart's second panel and legend
    among them, shrink to the width instead of running past it."""
    measured = _measured(chromium, tmp_path, "narrow", _framed(rendered["html"], NARROW))
    for state in ("closed", "open"):
        assert measured[state]["viewport"] == NARROW, state
        assert measured[state]["scroll"] <= NARROW and 0 < measured[state]["images"] <= NARROW, (state, measured)


def test_the_narrow_check_catches_a_page_wider_than_the_window(chromium, tmp_path):
    page = '<!DOCTYPE html><html><body><div style="width: 560px">a chart of fixed width</div></body></html>'
    measured = _measured(chromium, tmp_path, "control-narrow", _framed(page, NARROW))
    assert measured["closed"]["scroll"] > NARROW


_PDF_OBJECT = re.compile(rb"(\d+) 0 obj(.*?)endobj", re.S)


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def pdf_pages(pdf: bytes) -> int:
    """How many pages a PDF has: its /Type /Page objects (the /Pages tree nodes are not pages)."""
    return len(re.findall(rb"/Type\s*/Page\b", pdf))


def pdf_text(pdf: bytes) -> str:
    """The text chromium's PDF shows on its pages, without whitespace (a cell's lines and words are
    broken where the page needs): every string its content streams show, read through the
    ToUnicode map of the font showing it. Enough for chromium's own PDFs (Flate streams, fonts of
    two-byte glyph ids, maps of bfchar and bfrange entries), no reader of PDFs in general."""
    objects = {int(m.group(1)): m.group(2) for m in _PDF_OBJECT.finditer(pdf)}

    def stream(number: int) -> bytes:
        head, _, data = objects[number].partition(b"stream")
        data = re.sub(rb"^\r?\n", b"", data)
        return zlib.decompressobj().decompress(data) if b"/FlateDecode" in head else data

    def glyphs(font: int) -> tuple[int, dict[int, str]]:
        """(hex digits per glyph, glyph id -> text) of a font object."""
        body, mapping = objects[font], {}
        to_unicode = re.search(rb"/ToUnicode\s+(\d+) 0 R", body)
        cmap = stream(int(to_unicode.group(1))) if to_unicode else b""
        for block in re.findall(rb"beginbfchar(.*?)endbfchar", cmap, re.S):
            for src, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
                mapping[int(src, 16)] = bytes.fromhex(dst.decode()).decode("utf-16-be")
        for block in re.findall(rb"beginbfrange(.*?)endbfrange", cmap, re.S):
            for low, high, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
                for offset in range(int(high, 16) - int(low, 16) + 1):
                    mapping[int(low, 16) + offset] = chr(int(dst, 16) + offset)
        return (4 if b"/Type0" in body else 2), mapping

    text = []
    for body in objects.values():
        if not re.search(rb"/Type\s*/Page\b", body):
            continue
        resources = re.search(rb"/Resources\s+(\d+) 0 R", body)
        fonts_dict = re.search(rb"/Font\s*<<(.*?)>>", objects[int(resources.group(1))] if resources else body, re.S)
        fonts = {name: glyphs(int(ref)) for name, ref in re.findall(rb"/(\S+?)\s+(\d+) 0 R",
                                                                      fonts_dict.group(1) if fonts_dict else b"")}
        contents = re.search(rb"/Contents\s*(\[[^\]]*\]|\d+ 0 R)", body)
        for ref in re.findall(rb"(\d+) 0 R", contents.group(1) if contents else b""):
            width, mapping = 4, {}
            for font, shown in re.findall(rb"/(\S+)\s+[\d.]+\s+Tf|(\[.*?\]\s*TJ|<[0-9A-Fa-f]*>\s*Tj)",
                                          stream(int(ref)), re.S):
                if font:
                    width, mapping = fonts.get(font, (4, {}))
                for run in re.findall(rb"<([0-9A-Fa-f]*)>", shown):
                    text += [mapping.get(int(run[i:i + width], 16), "") for i in range(0, len(run), width)]
    return _squeezed(unicodedata.normalize("NFKC", "".join(text)))  # NFKC: the "fi" ligature is "fi"


@pytest.fixture(scope="module")
def catalogued(tmp_path_factory) -> dict:
    """The synthetic legs and one more whose catalogue has 160 bad inputs of long ids and messages
    and whose three suites of 120 cases all pass, rendered without a history."""
    root = tmp_path_factory.mktemp("catalogued")
    write_legs(root / "runs")
    write_run(root / "runs" / "leg-catalogue", catalogue_records("cpu"), leg="cpu-catalogue",
              env=env_for("cpu-catalogue", "interpreter"))
    summary = summarize(load_results([root / "runs"]))
    page = write_html(root / "report.html", render_html(summary))
    return {"page": page, "bad_input": summary.bad_input()}


# Measured with chromium 156 on US Letter: 21 pages, where the page without its print stylesheet
# took 45 and cut the catalogue's error type, message and legs columns off the paper, and the
# stylesheet printing the rows of the 360 passing cases too takes 38. The catalogue alone (163 rows
# of about three lines) takes 13 of the 21; the bound leaves room for another chromium's fonts.
PRINTED_PAGES_AT_MOST = 26


def test_printed_the_page_keeps_the_catalogue_in_a_few_pages(catalogued, chromium, tmp_path):
    pdf = tmp_path / "report.pdf"
    _, requested = _chromium(chromium, tmp_path, "print", catalogued["page"].as_uri(), f"--print-to-pdf={pdf}",
                             "--no-pdf-header-footer")
    assert requested == []
    data = pdf.read_bytes()
    text = pdf_text(data)
    assert "FAILED" in text and "Bad-inputcatalogue(163)" in text  # the reader reads this PDF at all
    assert 1 < pdf_pages(data) <= PRINTED_PAGES_AT_MOST, pdf_pages(data)
    assert len(catalogued["bad_input"]) == 163
    for row in catalogued["bad_input"]:  # every column of every row, in order, on the paper
        legs = "".join(row.outcomes)  # no row ran on every leg: each names its legs
        cells = (row.suite, row.case, row.backend or "", row.error_type, row.error_message, legs)
        assert _squeezed("".join(cells)) in text, cells
    assert "test_round_trip_keeps_every_value" not in text  # rows of passing cases stay on the screen
    assert "suites/widths120cases" in text and "Pass/failmatrix" in text  # the suites' summaries print
    assert "assert0.031<=0.002" not in text  # a closed <details> stays closed: its summary only


def test_the_pdf_reader_finds_a_cut_column_missing(chromium, tmp_path):
    page = tmp_path / "cut.html"
    page.write_text('<!DOCTYPE html><html><body><div style="white-space: nowrap">kept '
                    + "x" * 400 + ' LOSTCOLUMN</div><p>second line</p></body></html>')
    pdf = tmp_path / "cut.pdf"
    _chromium(chromium, tmp_path, "control-print", page.as_uri(), f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    text = pdf_text(pdf.read_bytes())
    assert "kept" in text and "secondline" in text and "LOSTCOLUMN" not in text
    assert pdf_pages(pdf.read_bytes()) == 1
