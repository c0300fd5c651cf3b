"""Performance goals: read from the cases' records, met or missed, shown on the page and in the
summaries, and never a failure."""

from __future__ import annotations

from synthetic import env_for, rec, write_run

from harness.report import load_results, render_html, summarize
from harness.report.goals import figure_of, goals_of
from harness.report.text import markdown_summary, text_summary

GOALS = {"speedup.sdpa_fp16": 4.0, "pct_of_peak": 80.0}
NO_CHARTS = {"speedup": [], "bandwidth": [], "errors": []}


def _results(tmp_path):
    records = [
        rec("bench_decode", "long", variant="fused-3bit",
            metrics={"ms": 0.036, "pct_of_peak": 77.1, "speedup": {"sdpa_fp16": 3.4, "unfused": 64.0},
                     "goals": GOALS}),
        rec("bench_decode", "longer", variant="fused-3bit",
            metrics={"ms": 0.12, "pct_of_peak": 90.2, "speedup": {"sdpa_fp16": 4.1}, "goals": GOALS}),
        rec("bench_decode", "broken", "failed", variant="fused-3bit",
            metrics={"ms": 0.01, "pct_of_peak": 99.0, "speedup": {"sdpa_fp16": 9.0},
                     "goals": {"speedup.sdpa_fp16": 4.0}}),
        rec("bench_decode", "odd", metrics={"ms": 1.0, "goals": {"gbps": "fast", "ms": None}}),
        rec("bench_int8", "no_goals", metrics={"ms": 1.0, "speedup": {"torch_eager": 2.0}}),
    ]
    run = write_run(tmp_path / "run", records, leg="L", env=env_for("L", "gpu"))
    return load_results([run])


def test_each_goal_is_met_or_missed_by_the_figure_of_its_case(tmp_path):
    goals = goals_of(_results(tmp_path))
    found = {(g.case, g.figure): (g.value, g.met) for g in goals}
    assert found == {
        ("long", "speedup.sdpa_fp16"): (3.4, False),
        ("long", "pct_of_peak"): (77.1, False),
        ("longer", "speedup.sdpa_fp16"): (4.1, True),
        ("longer", "pct_of_peak"): (90.2, True),
        ("broken", "speedup.sdpa_fp16"): (None, False),  # a failed case has no figure
    }
    assert all(g.run_label == "L" and g.suite == "suites/bench_decode" for g in goals)


def test_figures_are_metrics_or_speedups_over_a_named_baseline():
    metrics = {"pct_of_peak": 50.0, "speedup": {"sdpa_fp16": 2.5}, "gbps": "nan"}
    assert figure_of(metrics, "pct_of_peak") == 50.0
    assert figure_of(metrics, "speedup.sdpa_fp16") == 2.5
    assert figure_of(metrics, "speedup.unfused") is None
    assert figure_of({"speedup": 3.0}, "speedup.sdpa_fp16") is None
    assert figure_of(metrics, "missing") is None


def test_goals_show_on_the_page_and_in_the_summaries_and_fail_nothing(tmp_path):
    summary = summarize(_results(tmp_path))
    assert summary.verdict == "FAILED"  # the failed case, not the missed goals
    html = render_html(summary, charts=NO_CHARTS)
    assert 'id="goals"' in html and "Performance goals (2 of 5 met)" in html
    assert "<b>2/5</b>goals met" in html and 'href="#goals"' in html
    assert html.count(">missed<") == 3 and html.count(">met<") == 2 and "no figure" in html
    text = text_summary(summary, width=200)
    assert "goals: 2 of 5 met" in text
    assert "missed suites/bench_decode::long [fused-3bit] speedup.sdpa_fp16 3.40" in text
    markdown = markdown_summary(summary)
    assert "**Performance goals: 2 of 5 met**" in markdown


def test_a_run_without_goals_shows_no_goal_section(tmp_path):
    run = write_run(tmp_path / "run", [rec("bench_int8", "a", metrics={"ms": 1.0})], leg="L",
                    env=env_for("L", "gpu"))
    summary = summarize(load_results([run]))
    html = render_html(summary, charts=NO_CHARTS)
    assert 'id="goals"' not in html and "goals met" not in html
    assert "goals" not in text_summary(summary) and "goals" not in markdown_summary(summary)
