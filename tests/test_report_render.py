"""The HTML page: escaping, anchors, charts, no external references, problems and edge cases."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from synthetic import HOSTILE, env_for, rec, write_run

from harness.report import load_results, render_html, summarize

EXTERNAL = re.compile(r"""(?:src|href|action|poster)\s*=\s*["']?\s*(?:https?:)?//"""
                      r"""|url\(\s*["']?\s*(?:https?:)?//|@import""", re.I)


class Page(HTMLParser):
    """Collects ids, in-page links, images and the text of the page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[str] = []
        self.images: list[dict] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        if tag == "img":
            self.images.append(attrs)

    def handle_data(self, data):
        self.text.append(data)


def test_hostile_strings_come_out_escaped(rendered):
    html = rendered["html"]
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "\x07" not in html
    page = Page(html)
    assert "script" not in page.tags
    assert any(HOSTILE in t for t in page.text)  # shown to the reader as text


def test_page_makes_no_external_reference(rendered):
    html = rendered["html"]
    assert not EXTERNAL.search(html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "<link" not in html and "<iframe" not in html


def test_every_in_page_link_has_a_target(rendered):
    page = Page(rendered["html"])
    assert len(page.ids) == len(set(page.ids))
    assert set(page.links) <= set(page.ids)
    assert sum(link.startswith("c") for link in page.links) >= 25  # matrix cells and suite tables


def test_charts_are_inline_svg_that_parses(rendered):
    images = Page(rendered["html"]).images
    assert len(images) >= 9
    for image in images:
        assert image["src"].startswith("data:image/svg+xml;base64,") and image["alt"]
        svg = ET.fromstring(base64.b64decode(image["src"].split(",", 1)[1]))
        assert svg.tag.endswith("svg")
    html = rendered["html"]
    for title in ("suites/bench_decode: speedup over sdpa_fp16 (NVIDIA H200, gpu)",
                  "suites/bench_int8: % of measured copy bandwidth (NVIDIA H200, gpu)",
                  "suites/bench_decode: % of the read floor (NVIDIA H200, gpu)",
                  "suites/bench_decode: achieved GB/s (CPU, interpreter)", "Worst errors per case"):
        assert title in html


def test_banner_matrix_and_sections(rendered):
    html = rendered["html"]
    text = " ".join(Page(html).text)
    assert html.index("FAILED") < html.index('id="matrix"')
    assert "incomplete run: cpu-interpreter" in text
    for section in ("matrix", "failing", "regressions", "charts", "suites", "bad-input", "environment", "problems"):
        assert f'id="{section}"' in html
    assert "last line (truncated?)" in text
    assert "NVIDIA H200 (132 SMs, sm_90, 139.8 GiB, L2 60.0 MiB)" in text
    assert "4,250 GB/s (device copy, read + write)" in text
    assert "values: expected dtype torch.uint8, got torch.float32" in text
    assert re.search(r"new failure.*test_decode_matches_fp64\[cuda:0-S257\]", text)


def test_empty_run_and_no_input_render(tmp_path):
    run_dir = write_run(tmp_path / "empty", [], leg="nothing", env=env_for("nothing", "interpreter"))
    for paths in ([run_dir], [tmp_path / "missing"]):
        html = render_html(summarize(load_results(paths)))
        text = " ".join(Page(html).text)
        assert "NO RESULTS" in text and "No case was recorded" in text
        assert not EXTERNAL.search(html)


def test_case_tables_show_one_figure_per_cell_and_fold_the_rest(tmp_path):
    run_dir = write_run(tmp_path / "r", [rec("bits", "test_a", metrics={"states_checked": 7, "seed": 3}),
                                         rec("bits", "test_b", "failed", message="E   boom\nE   second")],
                        leg="L", env=env_for("L", "interpreter"))
    html = render_html(summarize(load_results([run_dir])))
    table = html[html.index('id="c0-0"'):]
    table = table[: table.index("</table>")]
    assert "max abs err" not in table and "speedup" not in table and "<th>device</th>" not in table
    assert table.index("test_b") < table.index("test_a")  # not passing first
    assert '<span class="fig">7 checked</span>' in table
    assert "<summary>boom</summary>" in table and "<summary>figures</summary>" in table
    assert '<span class="mono">checked=7, seed=3.00</span>' in table  # folded under "figures"


def test_environment_shows_where_the_time_went(tmp_path):
    import json

    from harness.measure import timeline
    from harness.records import MANIFEST_FILE

    plain = write_run(tmp_path / "plain", [rec("bits", "test_a")], leg="A", env=env_for("A", "interpreter"))
    timed = write_run(tmp_path / "timed", [rec("bits", "test_a")], leg="B", env=env_for("B", "interpreter"))
    manifest = json.loads((timed / MANIFEST_FILE).read_text())
    manifest["timeline"] = timeline.build(
        {"started": 10.0, "first_test": 17.9, "last_test_end": 29.1, "finished": 30.3},
        {"gw0": {"started": 13.0, "collected": 16.0, "first_test": 17.9, "last_test_end": 29.1}})
    (timed / MANIFEST_FILE).write_text(json.dumps(manifest))
    html = render_html(summarize(load_results([plain, timed])))
    env = html[html.index('id="environment"'):]
    row = env[env.index("where the time went"):]
    row = row[: row.index("</tr>")]
    cells = re.findall(r'<td class="t">(.*?)</td>', row)
    assert cells[0] == "" and cells[1].startswith("first test at 7.9 s (1 worker ready 7.9 s median")
    assert "tests 11.2 s" in cells[1] and "session ended at 20.3 s" in cells[1]


def test_environment_names_the_optional_packages_installed_and_missing(tmp_path):
    gpu = write_run(tmp_path / "gpu", [rec("bits", "test_a")], leg="G", env=env_for("G", "gpu"))
    cpu = write_run(tmp_path / "cpu", [rec("bits", "test_a")], leg="C", env=env_for("C", "interpreter"))
    html = render_html(summarize(load_results([gpu, cpu])))
    env = html[html.index('id="environment"'):]
    row = env[env.index("optional packages"):]
    cells = re.findall(r'<td class="t">(.*?)</td>', row[: row.index("</tr>")])
    assert cells == ["flashinfer-python 0.6.18, transformers 5.17.0; not installed: flash-attn",
                     "transformers 5.17.0; not installed: flash-attn, flashinfer-python"]


def test_environment_shows_the_triton_compiles_of_a_spread_run(tmp_path):
    import json

    from harness.records import MANIFEST_FILE

    plain = write_run(tmp_path / "plain", [rec("bits", "test_a")], leg="A", env=env_for("A", "interpreter"))
    spread = write_run(tmp_path / "spread", [rec("bits", "test_a")], leg="B", env=env_for("B", "interpreter"))
    manifest = json.loads((spread / MANIFEST_FILE).read_text())
    manifest["triton_compiles"] = {"stored": 281, "loaded_after_wait": 5}
    (spread / MANIFEST_FILE).write_text(json.dumps(manifest))
    html = render_html(summarize(load_results([plain, spread])))
    env = html[html.index('id="environment"'):]
    row = env[env.index("Triton kernels"):]
    row = row[: row.index("</tr>")]
    assert re.findall(r'<td class="t">(.*?)</td>', row) == ["", "281 compiled, 5 waited for in another worker"]


def _svg_texts(charts) -> str:
    return "\n".join(base64.b64decode(chart.uri.split(",", 1)[1]).decode("utf-8") for chart in charts)


def test_speed_and_bandwidth_charts_draw_only_cases_that_passed(tmp_path):
    from harness.report.charts import PASSED_ONLY, all_charts

    figures = {"ms": 1e-3, "gbps": 9000.0, "pct_of_peak": 4000.0, "pct_of_read_floor": 900.0,
               "speedup": {"base": 110.0}}
    records = [rec("bench_x", "t[ok]", backend="triton", variant="ok", device="cuda:0",
                   metrics={"ms": 0.1, "gbps": 20.0, "pct_of_peak": 50.0, "pct_of_read_floor": 40.0,
                            "speedup": {"base": 1.5}})]
    records += [rec("bench_x", f"t[{outcome}]", outcome, backend="triton", variant=outcome, device="cuda:0",
                    metrics=figures) for outcome in ("failed", "error", "crashed", "timeout")]
    charts = all_charts(summarize(load_results([write_run(tmp_path / "r", records, leg="L", env=env_for("L", "gpu"))])))
    drawn = charts["speedup"] + charts["bandwidth"]
    assert len(drawn) == 3 and all(PASSED_ONLY in chart.caption for chart in drawn)
    svg = _svg_texts(drawn)
    assert "1.50\N{MULTIPLICATION SIGN}" in svg and "50%" in svg and "40%" in svg and "triton/ok" in svg
    for shown_if_failed_counted in ("110\N{MULTIPLICATION SIGN}", "4000%", "900%", "triton/failed", "triton/timeout"):
        assert shown_if_failed_counted not in svg


def test_a_lone_surrogate_in_any_field_never_stops_the_report(tmp_path):
    from harness.report import (
        compare,
        make_baseline,
        markdown_summary,
        text_summary,
        write_html,
        write_junit,
    )

    bad = "\udcff"
    metrics = {"ms": 0.1, "gbps": 5.0, "pct_of_peak": 10.0, "speedup": {"base" + bad: 2.0}, "shape": "S" + bad,
               "max_abs_err": 0.1, "other" + bad: "x" + bad, "error_type": "E" + bad, "error_message": "m" + bad}
    records = [rec("bench" + bad, f"t[{outcome}{bad}]", outcome, backend="triton" + bad, variant="v" + bad,
                   device="cuda" + bad, message="E   boom " + bad, metrics=metrics) for outcome in ("passed", "failed")]
    env = {**env_for("L" + bad, "gpu", host="h" + bad), "gpu": "G" + bad}
    results = load_results([write_run(tmp_path / "r", records, leg="L" + bad, env=env)])
    summary = summarize(results, compare(results, make_baseline(results), source="base" + bad + ".json"))
    html = write_html(tmp_path / "out" / "report.html", render_html(summary, title="t" + bad)).read_text("utf-8")
    junit = write_junit(tmp_path / "out" / "junit.xml", results)
    ET.parse(junit)
    texts = [html, junit.read_text("utf-8"), markdown_summary(summary, report_name="r" + bad), text_summary(summary)]
    for text in texts:
        text.encode("utf-8")
        assert "\N{REPLACEMENT CHARACTER}" in text
    assert "boom \N{REPLACEMENT CHARACTER}" in html and len(Page(html).images) >= 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["junit.xml", "report.html"]


def test_a_record_line_of_wrong_types_is_a_read_problem_on_the_page(tmp_path):
    import json

    from harness.records import RECORDS_FILE

    run_dir = write_run(tmp_path / "r", [rec("bits", "test_a")], leg="L", env=env_for("L", "interpreter"))
    good = json.loads((run_dir / RECORDS_FILE).read_text())
    with open(run_dir / RECORDS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({**good, "case": "test_b", "metrics": None}) + "\n")
        fh.write(json.dumps({**good, "case": "test_c", "duration_s": "slow"}) + "\n")
    results = load_results([run_dir])
    html = render_html(summarize(results))
    assert [r.case for r in results.runs[0].records] == ["test_a"]
    assert "line 2 unreadable: field &#39;metrics&#39; must be an object, got NoneType" in html
    assert "unreadable: field &#39;duration_s&#39; must be a number, got &#39;slow&#39;" in html


def test_error_axis_leaves_errors_below_the_floor_at_its_edge():
    from harness.report.charts import ERROR_FLOOR, error_axis_limits

    low, high = error_axis_limits([1e-157, 0.0, 2e-4, 3e-3, float("nan"), float("inf")])
    assert ERROR_FLOOR / 3 <= low <= 2e-4 / 30 and abs(high - 3e-3 * 30) < 1e-12
    assert error_axis_limits([]) == (1e-8 / 30, 30.0)


def _tick_exponents(svg: str) -> list[int]:
    """The powers of ten that label a chart's log-axis ticks (matplotlib notes each label's TeX)."""
    return [int(power) for power in re.findall(r"\\mathdefault\{10\^\{([^}]*)\}\}", svg.replace("\N{MINUS SIGN}", "-"))]


def test_errors_far_above_the_rest_leave_the_axis_to_the_bulk_and_are_named(tmp_path):
    """Two round trips of inputs near 1e30 err near 1e29 within their bound: drawn at the right edge
    and named in the caption, the axis stays on the other cases' errors (failed ones among them)."""
    from harness.report.charts import error_axis_limits, error_chart, error_fence

    bulk = [rec("affine", f"test_round_trip[{i}]", metrics={"max_abs_err": 1e-4 * (1 + i), "max_rel_err": 1e-3})
            for i in range(8)]
    failed = rec("decode", "test_decode[S257]", "failed", metrics={"max_abs_err": 3.1e-2})
    huge = [rec("affine", f"test_kinds[huge-{b}]", metrics={"max_abs_err": 4.6e29}) for b in ("torch", "triton")]
    values = [r.metrics["max_abs_err"] for r in [*bulk, failed, *huge]]
    assert 3.1e-2 < error_fence(values) < 4.6e29
    assert error_axis_limits(values)[1] == pytest.approx(3.1e-2 * 30)  # the failed case stays on the axis
    assert error_fence([]) == float("inf")

    run_dir = write_run(tmp_path / "r", [*bulk, failed, *huge], leg="L", env=env_for("L", "interpreter"))
    chart = error_chart(summarize(load_results([run_dir])))
    assert "off the axis" in chart.caption
    assert "max_abs_err 4.60e+29 suites/affine::test_kinds[huge-torch]" in chart.caption
    assert "suites/affine::test_kinds[huge-triton]" in chart.caption and "test_round_trip" not in chart.caption
    svg = _svg_texts([chart])
    assert max(_tick_exponents(svg)) < 5  # not stretched towards 1e30
    assert "named below" in svg  # the legend says what the mark at the edge is


def test_an_error_chart_with_nothing_off_the_axis_says_nothing_of_it(tmp_path):
    from harness.report.charts import error_chart

    run_dir = write_run(tmp_path / "r",
                        [rec("affine", f"t[{i}]", metrics={"max_abs_err": 10.0 ** -i}) for i in range(6)],
                        leg="L", env=env_for("L", "interpreter"))
    chart = error_chart(summarize(load_results([run_dir])))
    assert "off the axis" not in chart.caption and "named below" not in _svg_texts([chart])
    assert min(_tick_exponents(_svg_texts([chart]))) <= -5


def _section(html: str, section: str) -> str:
    start = html.index(f'<section id="{section}">')
    return html[start: html.index("</section>", start)]


def _suite_block(html: str, name: str) -> str:
    """The block of one suite in the Suites section, from its heading to the next suite's."""
    suites = _section(html, "suites")
    start = suites.index(f">{name}</h3>")
    end = suites.find("<h3 ", start)
    return suites[start: end if end > 0 else None]


def test_suites_list_each_case_once_with_one_cell_per_leg(rendered):
    block = _suite_block(rendered["html"], "suites/decode")
    cases = block[block.index('<table class="cases">'):]
    rows = re.findall(r"<tr(?: class=\"screen-only\")?><td class=\"t case\">(.*?)</td>", cases)
    assert len(rows) == len(set(rows)) == 9  # 4 interpreter cases, 5 GPU cases (S257 failed on one leg)
    # not passing first
    assert rows[0] in ("test_decode_matches_fp64[cuda:0-S257]", "test_decode_long_context[S1048576]")
    assert cases.count('<td class="lc">') == 9 * 3 and cases.count("<details>") == 9
    assert re.search(r'<th class="leg" id="c\d+-0"><a class="self" href="#c\d+-0">cpu-interpreter</a>', cases)
    assert "15.5\N{MULTIPLICATION SIGN} tol" in cases  # the failed case's error against its tolerance
    bad_input = _suite_block(rendered["html"], "suites/bad_input")
    legs = bad_input[bad_input.index('<table class="legs">'): bad_input.index("</table>")]
    assert "passed" in legs and "worst abs" not in legs and "bit errors" not in legs  # no empty columns


def test_the_banner_gives_the_run_s_wall_time_and_the_case_nearest_its_tolerance(rendered):
    banner = rendered["html"][rendered["html"].index('<header class="banner'): rendered["html"].index("<nav>")]
    text = re.sub(r"\s+", " ", "".join(Page(banner).text))
    assert "wall time 7m 12s (first start to last end of the runs read)" in text
    assert ("worst error 15.5\N{MULTIPLICATION SIGN} its tolerance: suites/decode::test_decode_matches_fp64"
            "[cuda:0-S257] [triton/splitk] on torch2.10-triton3.5 (of 27 cases with a tolerance)") in text
    assert "worst abs" not in text


def test_long_environment_values_are_folded_and_the_tables_wrap(tmp_path):
    from harness.report.render import ENV_FOLD

    args = ["suites", "-k", "x" * 400]
    run_dir = write_run(tmp_path / "r", [rec("bits", "test_a", "failed", message="E   " + "y" * 500)], leg="L",
                        env=env_for("L", "gpu"))
    manifest = run_dir / "manifest.json"
    listed = ", ".join(f'"{a}"' for a in args)
    manifest.write_text(manifest.read_text().replace('"args": [', '"args": [' + listed + ", "))
    html = render_html(summarize(load_results([run_dir])))
    env = _section(html, "environment")
    assert '<table class="env">' in env and '<col class="name">' in env
    folded = re.search(r"<details><summary>([^<]*)</summary>([^<]*)</details>", env)
    assert folded and len(folded.group(1)) == ENV_FOLD // 2 and "x" * 400 in folded.group(2)
    assert '<table class="failing">' in _section(html, "failing")
    for rule in ("table.failing, table.env, table.bad-input { table-layout: fixed; width: 100%; min-width: 600px; }",
                 "table.failing td, table.env td, table.bad-input td "
                 "{ white-space: normal; overflow-wrap: anywhere; }"):
        assert rule in html


def test_change_points_leave_the_band_of_the_runs_before():
    from harness.report.charts import BAND_FLOOR, change_points, noise_band, run_bands

    assert noise_band([1.0, 1.0]) is None  # too few runs for a band
    low, high = noise_band([1.0, 1.0, 1.0])
    assert (low, high) == pytest.approx((1 - BAND_FLOOR, 1 + BAND_FLOOR))  # no spread: the floor
    values = [1.0, 1.02, 0.98, 1.01, 1.5, 1.52, None, 0.99]
    assert change_points(values) == [4, 5]
    assert run_bands(values)[3] is not None and run_bands(values)[2] is None
    noisy = [1.0, 1.4, 0.7, 1.2, 0.8, 1.45]  # wide spread: a wide band, nothing flagged
    assert change_points(noisy) == []


def test_trend_charts_draw_the_history_with_this_run_last(rendered):
    html = rendered["html"]
    charts = _section(html, "charts")
    titles = re.findall(r'<figure class="chart chart-trend"><div class="ftitle">([^<]*)</div>', charts)
    assert titles == ["suites/bench_decode: ms over the last 7 runs (torch2.11-triton3.6, NVIDIA H200)",
                      "suites/bench_int8: ms over the last 7 runs (torch2.11-triton3.6, NVIDIA H200)",
                      "suites/bench_peers: ms over the last 7 runs (torch2.11-triton3.6, NVIDIA H200)"]
    assert "Not drawn: cpu-interpreter: 0 run(s)" in charts  # no history of the other legs
    svgs = [base64.b64decode(uri).decode() for uri in
            re.findall(r'class="chart chart-trend">.*?src="data:image/svg\+xml;base64,([^"]+)"', charts)]
    assert all(label in svgs[0] for label in ("0000000", "5555555", "this run", "change point", "noise band"))
    assert "#cf222e" in svgs[0]  # change points drawn (the step at run 4)


def _trend_note(html: str) -> str:
    return re.search(r'<p class="note" id="charts-trend">No trend chart: ([^<]*)</p>', html).group(1)


def test_no_trend_chart_and_one_line_why_when_the_history_cannot_serve(tmp_path, legs):
    import sqlite3

    from synthetic import write_history

    summary = summarize(load_results([legs[0]]))
    missing = tmp_path / "nowhere" / "h.sqlite"
    assert _trend_note(render_html(summary, history=missing)) == f"no run history at {missing}"
    assert not missing.parent.exists()
    assert "no run history given" in _trend_note(render_html(summary))
    one = tmp_path / "one.sqlite"
    write_history(one, tmp_path / "one", runs=1, leg="other-leg")
    write_history(one, tmp_path / "two", runs=1)  # one earlier run + this run = 2 runs: drawn
    assert 'class="chart chart-trend"' in render_html(summary, history=one)
    assert "fewer than 2 runs to draw" in _trend_note(render_html(summary, history=one, trend_runs=1))
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database " * 200)
    assert "not a readable SQLite database" in _trend_note(render_html(summary, history=corrupt))
    locked = tmp_path / "locked.sqlite"
    write_history(locked, tmp_path / "locked")
    with sqlite3.connect(locked, isolation_level=None) as holder:
        holder.execute("PRAGMA journal_mode=DELETE")
        holder.execute("BEGIN EXCLUSIVE")
        assert "locked" in _trend_note(render_html(summary, history=locked))
        holder.execute("ROLLBACK")


def test_a_leg_without_a_tolerance_beside_one_with_it_renders(tmp_path):
    """One leg records a case's tolerance, another skips the case: the suite's per-leg table
    shows the ratio column for the first and nothing for the second, and the page renders."""
    with_tol = write_run(tmp_path / "a", [rec("affine", "test_x", metrics={"max_abs_err": 2e-3, "tolerance": 1e-3})],
                         leg="L1", env=env_for("L1", "interpreter"))
    skipped = write_run(tmp_path / "b", [rec("affine", "test_x", "skipped")], leg="L2",
                        env=env_for("L2", "interpreter"))
    html = render_html(summarize(load_results([with_tol, skipped])))
    assert "L1" in html and "L2" in html and "badnum" in html  # 2x its tolerance is marked on L1
