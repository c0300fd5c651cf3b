"""The one-screen text summary and the Markdown summary."""

from __future__ import annotations

from synthetic import HOSTILE

from harness.report import (
    compare,
    load_results,
    make_baseline,
    markdown_summary,
    summarize,
    text_summary,
)
from harness.report.text import md_escape


def _summary(legs):
    comparison = compare(load_results([legs[0].parent]), make_baseline(load_results([legs[0]])), source="b.json")
    return summarize(load_results([legs[0].parent]), comparison)


def test_text_summary_fits_one_screen_and_names_the_report(legs):
    text = text_summary(_summary(legs), report_path="reports/report.html", junit_path="reports/report.junit.xml")
    lines = text.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 120
    assert lines[0].startswith("kv harness: FAILED  (3 leg(s)")
    assert "2 failed" in lines[1] and "1 crashed" in lines[1] and "1 timeout" in lines[1]
    assert any("cpu-interpreter" in line and "INCOMPLETE" in line for line in lines)
    assert any(line.strip().startswith("FAILED") and "S257" in line for line in lines)
    assert any("regressions vs b.json" in line and "new failure" in line for line in lines)
    assert lines[-2] == "  report:   reports/report.html"
    assert lines[-1] == "  junit:    reports/report.junit.xml"


def test_markdown_summary_escapes_and_shows_the_matrix(legs):
    md = markdown_summary(_summary(legs), report_name="report.html")
    assert md.startswith("### \u274c kv harness: FAILED")
    assert "<script" not in md and "&lt;script&gt;" in md
    assert "| suites/decode | \u2705 3/3 | \u274c 3/5 | \u2705 4/4 |" in md
    assert "**incomplete run:** cpu-interpreter" in md
    assert "Full report: report.html" in md


def test_md_escape_neutralises_markup():
    assert md_escape(f"a|b *c* _d_ {HOSTILE}\nnext") == (
        "a\\|b \\*c\\* \\_d\\_ &lt;script&gt;alert(\"x\")&lt;/script&gt; next")


def test_markdown_summary_says_where_each_run_s_time_went(tmp_path):
    import json

    from synthetic import env_for, rec, write_run

    from harness.measure import timeline
    from harness.records import MANIFEST_FILE

    timed = write_run(tmp_path / "timed", [rec("bits", "test_a")], leg="L", env=env_for("L", "interpreter"))
    manifest = json.loads((timed / MANIFEST_FILE).read_text())
    manifest["timeline"] = timeline.build({"started": 0.0, "first_test": 4.5, "last_test_end": 71.5, "finished": 72.4},
                                          {"gw0": {"started": 1.0, "first_test": 4.5}})
    (timed / MANIFEST_FILE).write_text(json.dumps(manifest))
    md = markdown_summary(summarize(load_results([timed])))
    (line,) = [ln for ln in md.splitlines() if "first test at" in ln]
    assert line.endswith("first test at 4.5 s (1 worker ready 4.5 s median, 4.5 s last) \N{MIDDLE DOT} tests 67.0 s "
                         "\N{MIDDLE DOT} wind-down 0.9 s \N{MIDDLE DOT} session ended at 72.4 s")
    plain = write_run(tmp_path / "plain", [rec("bits", "test_a")], leg="P", env=env_for("P", "interpreter"))
    assert "first test at" not in markdown_summary(summarize(load_results([plain])))


def test_non_finite_values_have_one_spelling_in_every_column(tmp_path):
    import math
    import re

    from synthetic import env_for, rec, write_run

    from harness.report import fmt, render_html

    formatters = (fmt.fmt_count, fmt.fmt_err, fmt.fmt_sig, fmt.fmt_pct, fmt.fmt_x, fmt.fmt_signed_pct,
                  fmt.fmt_duration, lambda v: fmt.fmt_metric("ms", v), lambda v: fmt.fmt_metric("custom", v))
    for value, spelling in ((math.nan, "NaN"), ("nan", "NaN"), (math.inf, "inf"), ("-inf", "-inf")):
        assert [f(value) for f in formatters] == [spelling] * len(formatters), value
    nan = float("nan")
    run_dir = write_run(tmp_path / "r", [rec("bench", "t", backend="triton", duration_s=nan, metrics={
        "ms": nan, "gbps": nan, "pct_of_peak": nan, "max_abs_err": nan, "speedup": {"base": nan}, "custom": nan})],
        leg="L", env=env_for("L", "gpu"))
    html = render_html(summarize(load_results([run_dir])))
    suite = html[html.index('id="c0-0"'):]
    assert '<span class="fig">NaN ms</span>' in suite  # the case's cell
    (details,) = re.findall(r'<span class="mono">([^<]*)</span>', suite)  # its folded figures
    figures = dict(item.split("=", 1) for item in details.split(", "))
    assert {name: figures[name] for name in ("max abs err", "ms", "GB/s", "% peak", "speedup", "custom")} == {
        "max abs err": "NaN", "ms": "NaN", "GB/s": "NaN", "% peak": "NaN", "speedup": "NaN base", "custom": "NaN"}
    assert not any(re.search(r"nan(%|\N{MULTIPLICATION SIGN})|\bnan\b", value) for value in figures.values())


def test_the_headline_names_the_case_nearest_its_tolerance_and_the_wall_time(legs):
    summary = _summary(legs)
    md = markdown_summary(summary)
    where = "suites/decode::test\\_decode\\_matches\\_fp64\\[cuda:0-S257\\] \\[triton/splitk\\] on torch2.10-triton3.5"
    assert (f"126M states/elements checked, 0 bit errors; worst error 15.5\N{MULTIPLICATION SIGN} its tolerance: "
            f"{where} (of 27 cases with a tolerance).") in md
    assert "worst abs error" not in md and "worst rel error" not in md
    assert "wall time **7m 12s** from the first start to the last end of 3 run directories" in md
    lines = text_summary(summary, width=200).splitlines()
    assert lines[0].endswith("of test time, 7m 12s wall)")
    assert lines[2:4] == ["  126M states/elements checked, 0 bit errors",
                          "  worst error 15.5\N{MULTIPLICATION SIGN} its tolerance: "
                          "suites/decode::test_decode_matches_fp64[cuda:0-S257] [triton/splitk] on "
                          "torch2.10-triton3.5 (of 27 cases with a tolerance)"]


def test_the_pipeline_line_names_its_leg_and_leaves_the_wall_time_to_the_runs(legs):
    summary = _summary(legs)
    summary.pipeline = {"kind": "gpu_verify", "leg": "torch2.11-triton3.6", "wall_s": 402.0, "gpus": ["0"],
                        "steps": [{"step": "suites", "rc": 0, "ok": True, "seconds": 300.0}]}
    md = markdown_summary(summary)
    # each number labelled: the step's own time, then the pipeline's wall time (set-up included)
    assert ("pipeline gpu\\_verify (leg torch2.11-triton3.6): suites 300.0 s \N{MIDDLE DOT} "
            "pipeline total 402.0 s") in md
    assert "wall time **7m 12s**" in md and "wall time **402" not in md


def test_the_worst_error_to_tolerance_says_what_the_tolerance_is(legs, tmp_path):
    from synthetic import env_for, rec, write_run

    from harness.report.summary import TOLERANCE_NOTE

    md = markdown_summary(_summary(legs))
    assert f"(of 27 cases with a tolerance). ({md_escape(TOLERANCE_NOTE, 400)})" in md
    lines = text_summary(_summary(legs), width=160).splitlines()
    assert max(map(len, lines)) <= 160
    assert f"(of 27 cases with a tolerance) ({TOLERANCE_NOTE})" in " ".join(line.strip() for line in lines)
    untoleranced = summarize(load_results([write_run(tmp_path / "r", [rec("bits", "test_a")], leg="L",
                                                     env=env_for("L", "interpreter"))]))
    assert "tolerance is" not in markdown_summary(untoleranced) + text_summary(untoleranced)


def test_the_full_report_is_downloaded_only_from_ci(legs):
    local = markdown_summary(_summary(legs), report_name="reports/report.html")
    assert "Full report: reports/report.html (open it in a browser)." in local and "download" not in local
    ci = markdown_summary(_summary(legs), report_name="report.html", in_ci=True)
    assert "Full report: report.html (download the job's artifact and open it)." in ci


def test_a_ratio_to_the_tolerance_never_reads_1_unless_it_is_at_the_limit():
    from harness.report.fmt import fmt_ratio

    assert [fmt_ratio(v) for v in (0.99999, 1.0, 1.0001, 3.1e-2 / 2e-3, 0.0370, 0.0, "nan")] == [
        "0.999", "1.00", "1.01", "15.5", "0.0370", "0", "NaN"]
