"""The report: merge result sets, render one self-contained HTML page, JUnit XML, summaries.

::

    from harness.report import load_results, summarize, render_html
    results = load_results(["reports/runs/leg-a", "reports/runs/leg-b"])
    html = render_html(summarize(results))

Command line: ``python -m harness report RESULTS... [-o reports/report.html]``.
"""

from .baseline import Comparison, compare, make_baseline, read_baseline, write_baseline
from .junit import junit_tree, write_junit
from .load import ResultSet, Run, load_results
from .render import render_html, write_html
from .summary import Summary, summarize
from .text import markdown_summary, text_summary

__all__ = [
    "Comparison",
    "ResultSet",
    "Run",
    "Summary",
    "compare",
    "junit_tree",
    "load_results",
    "make_baseline",
    "markdown_summary",
    "read_baseline",
    "render_html",
    "summarize",
    "text_summary",
    "write_baseline",
    "write_html",
    "write_junit",
]
