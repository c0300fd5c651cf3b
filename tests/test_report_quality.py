"""The report's quality section: entries from the quality benchmark's records, the quality/size
Pareto front, the chart and the table, and the page with and without them."""

from __future__ import annotations

import base64

from synthetic import env_for, rec, write_run

from harness.report import load_results, render_html, summarize
from harness.report.quality import quality_charts, quality_front, quality_protocols, quality_rows

PROTOCOL = "2 segments x (256-token prompt prefilled, then 512 teacher-forced decode steps) = 1024 scored tokens"
CACHES = {
    "full": {"perplexity": 18.3, "perplexity_change": 0.0, "kl": 0.0, "top1": 1.0, "greedy_matched": 32.0,
             "bytes_per_token": 46080},
    "fp16": {"perplexity": 18.3, "perplexity_change": -1e-5, "kl": 0.0, "top1": 1.0, "bytes_per_token": 23040},
    "kvbits-4bit": {"perplexity": 18.39, "perplexity_change": 0.0049, "kl": 0.0112, "top1": 0.933,
                    "greedy_matched": 17.0, "bytes_per_token": 6480},
    "kvbits-3bit": {"perplexity": 18.75, "perplexity_change": 0.0248, "kl": 0.0466, "top1": 0.872,
                    "bytes_per_token": 5040},
    "quanto-int4": {"perplexity": 18.87, "perplexity_change": 0.0315, "kl": 0.0289, "top1": 0.923,
                    "bytes_per_token": 7200},  # larger and further from fp32 than kvbits-4bit
    "3bit, g64, kvbits, window 128, sinks 64": {"perplexity": 18.44, "perplexity_change": 0.0077, "kl": 0.0065,
                                                "top1": 0.951},
    "broken": {"perplexity": "nan", "perplexity_change": "nan", "kl": "nan", "top1": 0.1},
}


def _summary(tmp_path, records):
    return summarize(load_results([write_run(tmp_path / "bench-L", records, leg="L", env=env_for("L", "gpu"))]))


def _case(case="standard", outcome="passed", caches=CACHES):
    return rec("bench_quality", f"test_bench_quality[{case}]", outcome, backend="transformers", variant=case,
               device="cuda", metrics={"caches": caches, "protocol": PROTOCOL})


def test_entries_come_from_passed_records_with_finite_figures(tmp_path):
    protocols = quality_protocols(_summary(tmp_path, [_case(), _case("long", "failed"),
                                                      rec("bench_quality", "test_other", "passed")]))
    assert [p.case for p in protocols] == ["test_bench_quality[standard]"]
    names = [e.name for e in protocols[0].entries]
    assert "broken" not in names and len(names) == len(CACHES) - 1


def test_front_and_rows(tmp_path):
    (protocol,) = quality_protocols(_summary(tmp_path, [_case()]))
    # the fp32 reference is no point; quanto-int4 is beaten by kvbits-4bit (smaller, closer)
    assert [e.name for e in quality_front(protocol.entries)] == ["kvbits-3bit", "kvbits-4bit", "fp16"]
    rows = quality_rows(protocol)
    assert [r["name"] for r in rows][:5] == ["kvbits-3bit", "kvbits-4bit", "quanto-int4", "fp16", "full"]
    assert rows[-1]["kind"] == "emulated" and rows[-1]["bytes_per_token"] == ""
    assert rows[1]["perplexity_change"] == "+0.49%" and rows[1]["greedy"] == "17.0"


def test_chart_and_page(tmp_path):
    summary = _summary(tmp_path, [_case()])
    (chart,) = quality_charts(summary)
    assert b"<svg" in base64.b64decode(chart.uri.split(",", 1)[1])
    assert "kvbits-3bit, kvbits-4bit, fp16" in chart.caption and PROTOCOL in chart.caption
    html = render_html(summary)
    assert 'id="charts-quality"' in html and "window 128, sinks 64" in html and "+3.15%" in html


def test_page_without_quality_records_has_no_section(tmp_path):
    html = render_html(_summary(tmp_path, [rec("bench_x", "test_y", "passed", metrics={"ms": 1.0})]))
    assert 'id="charts-quality"' not in html
