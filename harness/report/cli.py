"""``python -m harness report`` and ``python -m harness summarize``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import history
from .ab import ab_for_report
from .baseline import (
    DEFAULT_ERROR_FACTOR,
    DEFAULT_THRESHOLD_PCT,
    HISTORY_RUNS_NEEDED,
    ROLLING_THRESHOLD_PCT,
    compare_beside_history,
    compare_rolling,
    read_baseline,
    rolling_runs,
    write_baseline,
)
from .load import load_results, read_steps
from .summary import summarize
from .text import markdown_summary, text_summary


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="run directories (records.jsonl + manifest.json), records files, "
                             "or folders holding several run directories")
    parser.add_argument("--baseline", metavar="PATH",
                        help="baseline JSON to compare against (reports/baselines/...; a GPU model it was not "
                             "measured on against its own last runs in the run history, once that holds "
                             f"{HISTORY_RUNS_NEEDED} of each case), or history[:N]: each GPU leg against its last N "
                             "(default 5) complete runs in the run history")
    parser.add_argument("--threshold", type=float, default=None, metavar="PCT",
                        help=f"flag slowdowns over this many percent (default {DEFAULT_THRESHOLD_PCT:g} against a "
                             f"baseline file, {ROLLING_THRESHOLD_PCT:g} against the history)")
    parser.add_argument("--error-factor", type=float, default=DEFAULT_ERROR_FACTOR, metavar="X",
                        help="flag worst errors that grew over X times the baseline (default %(default)s)")
    parser.add_argument("--fail-on", choices=("never", "failures", "regressions"), default="never",
                        help="exit 1 when cases did not pass (failures) or also on regressions and "
                             "incomplete runs (regressions); default: always 0 once written")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description="kv harness results and reports")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="render the HTML report (and JUnit XML, Markdown summary)")
    _common(report)
    report.add_argument("-o", "--output", default="reports/report.html", metavar="HTML",
                        help="the HTML page (default %(default)s)")
    report.add_argument("--junit", metavar="PATH",
                        help="JUnit XML path (default: <output stem>.junit.xml beside the page)")
    report.add_argument("--no-junit", action="store_true", help="do not write JUnit XML")
    report.add_argument("--summary-md", metavar="PATH",
                        help="append the Markdown summary to PATH (e.g. $GITHUB_STEP_SUMMARY); "
                             "default: write it as <output stem>.md beside the page")
    report.add_argument("--write-baseline", metavar="PATH", help="also write these results as a baseline JSON")
    report.add_argument("--title", default="kv harness report", help="page title")
    report.add_argument("--steps", metavar="JSON",
                        help="a pipeline's steps file (<kind>-steps.json): its steps and wall time go in the report")
    report.add_argument("--history", default=None, metavar="FILE|URL",
                        help="the run history the trend charts (and the GPU models without a baseline file) read, "
                             "a SQLite file or a PostgreSQL URL (default "
                             f"$KVH_HISTORY or {history.DEFAULT_PATH}); "
                             "missing, locked or unreadable: the report says so and has no trend chart")
    report.add_argument("--no-history", action="store_true", help="draw no trend chart")
    report.add_argument("--ab", metavar="JSON", help="a same-job A/B's ab.json for the A/B section "
                                                    "(default: an ab.json beside the run directories that names them)")
    report.add_argument("--trend-runs", type=int, default=None, metavar="N",
                        help="runs per trend chart (default 10)")
    summ = sub.add_parser("summarize", help="print the one-screen text summary (and optionally Markdown)")
    _common(summ)
    summ.add_argument("--markdown", action="store_true", help="print the Markdown summary instead")
    sus = sub.add_parser("suspects", help="print the node ids of kernel cases whose timing regressed beyond "
                                          "threshold and noise, and of cases whose error grew past its factor, one "
                                          "per line (what a confirmation re-run re-runs)")
    _common(sus)
    # handed to harness/run/ab.py by main() before this parser sees it: listed so that --help names it
    sub.add_parser("ab", add_help=False, help="a same-job A/B of this tree against BASE, both timed in turns on one "
                                              "GPU (python -m harness ab --help; harness/run/ab.py)")
    return parser


def in_ci() -> bool:
    """Whether this report is rendered in CI: $CI set, as CI services do (GitHub Actions among them),
    the same test the run's manifest records (harness/run/env.py) and the container runner passes
    through (harness/run/commands.py)."""
    return bool(os.environ.get("CI"))


def _exit_code(summary, fail_on: str) -> int:
    if fail_on == "never":
        return 0
    if summary.stats.bad:
        return 1
    if fail_on == "regressions" and (summary.n_regressions or summary.incomplete or summary.n_problems):
        return 1
    return 0


def _comparison(parser: argparse.ArgumentParser, args, results):
    """The results against ``--baseline``: a baseline file (and, for GPU models it was not measured
    on, their runs in the run history), or the rolling baseline of the run history
    (``history[:N]``); the history is that of ``--history`` or $KVH_HISTORY."""
    options = {"error_factor": args.error_factor}
    where = getattr(args, "history", None) or history.history_location()
    if args.threshold is not None:
        options["threshold_pct"] = args.threshold
    try:
        last = rolling_runs(args.baseline)
        if last is not None:
            return compare_rolling(results, last, where, **options)
        baseline = read_baseline(args.baseline)
    except history.HistoryError as exc:  # a run's report never depends on the history: said, then none
        print(f"harness report: no rolling baseline, so no regression check: {exc}", file=sys.stderr)
        return None
    except ValueError as exc:
        parser.error(str(exc))
    # GPU models the file was not measured on: against their own runs in the history, where it has enough
    return compare_beside_history(results, baseline, where, source=Path(args.baseline).name, **options)


def _suspects(comparison) -> list[str]:
    """Node ids of the suspects (kernel slowdowns, grown errors), each once, in the comparison's order."""
    found = [] if comparison is None else [f.nodeid for f in comparison.suspects() if f.nodeid]
    return list(dict.fromkeys(found))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ab"]:  # its own parser: BASE and pytest arguments pass through untouched
        from ..run.ab import main as ab_main

        return ab_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    results = load_results(args.results)
    comparison = _comparison(parser, args, results) if args.baseline else None
    if args.command == "suspects":
        sys.stdout.write("".join(f"{nodeid}\n" for nodeid in _suspects(comparison)))
        return 0
    summary = summarize(results, comparison)
    if getattr(args, "steps", None):
        summary.pipeline = read_steps(args.steps)
    summary.ab = ab_for_report(args.results, getattr(args, "ab", None))

    if args.command == "summarize":
        sys.stdout.write(markdown_summary(summary) if args.markdown else text_summary(summary))
        return _exit_code(summary, args.fail_on)

    from .junit import write_junit
    from .render import render_html, write_html

    output = Path(args.output)
    junit = None if args.no_junit else Path(args.junit) if args.junit else output.with_name(output.stem + ".junit.xml")
    markdown_path = Path(args.summary_md) if args.summary_md else output.with_name(output.stem + ".md")
    links = {"JUnit XML": junit.name} if junit is not None and junit.parent == output.parent else {}
    trends_from = None if args.no_history else args.history or history.history_location()
    write_html(output, render_html(summary, title=args.title, links=links, history=trends_from,
                                   trend_runs=args.trend_runs))
    if junit is not None:
        write_junit(junit, results)
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    with open(markdown_path, "a" if args.summary_md else "w", encoding="utf-8") as fh:
        # in CI the page is read from the job's artifact, by name; on this machine, at its path
        ci = in_ci()
        fh.write(markdown_summary(summary, report_name=output.name if ci else str(output), in_ci=ci))
    if args.write_baseline:
        write_baseline(args.write_baseline, results,
                       threshold_pct=DEFAULT_THRESHOLD_PCT if args.threshold is None else args.threshold)
    sys.stdout.write(text_summary(summary, report_path=output, junit_path=junit, markdown_path=markdown_path))
    if args.write_baseline:
        sys.stdout.write(f"  baseline: {args.write_baseline}\n")
    sys.stdout.flush()
    return _exit_code(summary, args.fail_on)
