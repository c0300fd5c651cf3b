"""The one-screen text summary (end of a run) and the Markdown summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

import html
import shutil
import textwrap

from ..measure import timeline
from ..records import OUTCOMES
from .baseline import STATIC_METRICS
from .fmt import (
    clean_text,
    first_line,
    fmt_count,
    fmt_duration,
    fmt_err,
    fmt_ratio,
    fmt_sig,
    fmt_signed_pct,
)
from .goals import describe, goals_line, goals_of
from .summary import TOLERANCE_NOTE, Summary, suite_name

SHOWN = 8  # failing cases / regressions listed before "... and N more"
_COUNTED = ("passed", "failed", "error", "crashed", "timeout", "skipped")
assert set(_COUNTED) == set(OUTCOMES)


def counts_line(summary: Summary) -> str:
    return " \N{MIDDLE DOT} ".join(f"{summary.counts[o]} {o}" for o in _COUNTED)


def tolerance_line(summary: Summary) -> str:
    """``worst error 0.42x its tolerance: suite::case [impl] on leg (of 96 cases with a tolerance)``,
    or what there is instead."""
    figure = summary.closest_to_tolerance()
    if figure is None:
        return "no case recorded a tolerance"
    return (f"worst error {fmt_ratio(figure.ratio)}\N{MULTIPLICATION SIGN} its tolerance: {figure.where} "
            f"(of {figure.rated} cases with a tolerance)")


def tolerance_note(summary: Summary) -> str:
    """What the tolerance of :func:`tolerance_line` is, in parentheses; "" when no case has one."""
    return f"({TOLERANCE_NOTE})" if summary.closest_to_tolerance() is not None else ""


def pipeline_total(pipeline: dict) -> str:
    """The steps file's ``wall_s``, labelled: the pipeline's wall time from its start to the writing of
    that file (harness/run/pipeline.py), its set-up included, so at least the sum of its steps."""
    return f"pipeline total {pipeline['wall_s']:.1f} s"


def checked_line(summary: Summary) -> str:
    """``201M states/elements checked, 0 bit errors``; "" when no case counted what it checked."""
    stats = summary.stats
    if not stats.checked:
        return ""
    bits = f", {fmt_count(stats.bit_errors)} bit errors" if stats.bit_errors is not None else ""
    return f"{fmt_count(stats.checked)} states/elements checked{bits}"


def wall_text(summary: Summary) -> str:
    """``, 27m 03s wall`` from the first start to the last end of the runs read; "" when unknown."""
    wall = summary.wall_s
    return f", {fmt_duration(wall) or '0 s'} wall" if wall is not None else ""


def _finding_text(finding) -> str:
    """``slower  +29.7%  suite::case [backend/variant]  0.124 -> 0.161 ms  on leg``."""
    impl = "/".join(p for p in (finding.backend, finding.variant) if p)
    if finding.kind == "new failure":
        what = f"passed -> {finding.current}"
    elif finding.metric in ("ms", "gbps", *STATIC_METRICS):
        what = f"{fmt_sig(finding.baseline)} -> {fmt_sig(finding.current)} {finding.metric}"
    else:
        what = f"{finding.metric} {fmt_err(finding.baseline)} -> {fmt_err(finding.current)}"
    change = fmt_signed_pct(finding.change_pct) if finding.change_pct is not None else ""
    rerun = {True: ", repeated by its re-run", False: ", not repeated by its re-run"}.get(finding.confirmed, "")
    return (f"{finding.kind:<11} {change:>7}  {finding.suite}::{finding.case}"
            f"{' [' + impl + ']' if impl else ''}  {what}  on {finding.run_label}{rerun}")


# Timing changes a comparison lists apart from its regressions: (attribute, what they are).
APART = (
    ("unconfirmed", "slower or a grown error, not repeated by the re-run"),
    ("within_noise", "slower within the noise"),
    ("host_bound", "host-bound (the host's launch cost)"),
    ("cpu_baselines", "CPU baselines timed on the GPU host"),
)


def apart_lines(comparison) -> list[str]:
    """One line per kind of timing change not counted as a regression: how many, and the largest."""
    lines = []
    for name, what in APART:
        found = getattr(comparison, name)
        if found:
            lines.append(f"{what}: {len(found)}, e.g. {_finding_text(found[0])}")
    return lines


def text_summary(summary: Summary, *, report_path=None, junit_path=None, markdown_path=None,
                 width: int | None = None) -> str:
    """About 30 lines at most: verdict, counts, one line per leg, failures, regressions, paths.

    Lines are cut at ``width`` (default: the terminal's width, at least 100).
    """
    width = width or max(100, shutil.get_terminal_size((120, 24)).columns)
    out = [f"kv harness: {summary.verdict}  ({len(summary.runs)} leg(s), {summary.stats.total} cases, "
           f"{fmt_duration(summary.stats.duration_s) or '0 s'} of test time{wall_text(summary)})"]
    out.append("  " + counts_line(summary))
    for line in filter(None, (checked_line(summary), tolerance_line(summary))):
        out.append(clean_text("  " + line, width))
    out += textwrap.wrap(tolerance_note(summary), width, initial_indent="    ", subsequent_indent="    ")
    if summary.runs:
        name_w = min(40, max(len(run.label) for run in summary.runs))
        out.append(f"  {'leg':<{name_w}}  {'mode':<11} {'pass':>5} {'fail':>5} {'err':>4} {'crash':>5} "
                   f"{'t/o':>4} {'skip':>5}  status")
        for run, stats in zip(summary.runs, summary.run_stats, strict=True):
            c = stats.counts
            status = "complete" if run.complete else "INCOMPLETE"
            out.append(f"  {clean_text(run.label, name_w):<{name_w}}  {run.mode:<11} {c['passed']:>5} "
                       f"{c['failed']:>5} {c['error']:>4} {c['crashed']:>5} {c['timeout']:>4} "
                       f"{c['skipped']:>5}  {status}")
    failing = summary.failing()
    if failing:
        out.append(f"  not passing ({len(failing)}):")
        for run, record in failing[:SHOWN]:
            line = (f"    {record.outcome.upper():<8} {suite_name(record)}::{record.case}  [{run.label}]  "
                    f"{first_line(record.message, 200)}")
            out.append(clean_text(line, width))
        if len(failing) > SHOWN:
            out.append(f"    ... and {len(failing) - SHOWN} more in the report")
    comparison = summary.comparison
    if comparison is not None:
        kinds = comparison.kinds()
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
        out.append(f"  regressions vs {comparison.source} (threshold {comparison.threshold_pct:g}%): {detail}; "
                   f"{len(comparison.improvements)} faster, {comparison.compared} compared")
        for finding in comparison.regressions[:SHOWN]:
            out.append(clean_text("    " + _finding_text(finding), width))
        if len(comparison.regressions) > SHOWN:
            out.append(f"    ... and {len(comparison.regressions) - SHOWN} more in the report")
        for line in apart_lines(comparison):
            out.append(clean_text(f"    not counted, {line}", width))
        if comparison.references:
            out.append(clean_text(f"    reference measurements moved (not regressions of these kernels): "
                                  f"{len(comparison.references)}, e.g. {_finding_text(comparison.references[0])}",
                                  width))
        if comparison.not_comparable:
            out.append(clean_text("    timings not compared (other mode or GPU than the baseline): "
                                  + ", ".join(comparison.not_comparable), width))
        for note in comparison.history_notes:  # long: a leg, a GPU model and counts
            out += textwrap.wrap(clean_text(note, None), width, initial_indent="    ", subsequent_indent="      ")
    goals = goals_of(summary.results)
    if goals:
        missed = [g for g in goals if not g.met]
        out.append(f"  {goals_line(goals)} (set by the cases themselves; a missed goal fails nothing)")
        for goal in missed[:SHOWN]:
            out.append(clean_text("    missed " + describe(goal), width))
        if len(missed) > SHOWN:
            out.append(f"    ... and {len(missed) - SHOWN} more in the report")
    if summary.n_problems:
        out.append(f"  read problems: {summary.n_problems} (listed in the report)")
    for name, path in (("report", report_path), ("junit", junit_path), ("markdown", markdown_path)):
        if path:
            out.append(f"  {name + ':':<9} {path}")
    return "\n".join(out) + "\n"


def md_escape(text, limit: int | None = 200) -> str:
    """Text safe in a Markdown table cell: HTML-escaped, pipes and emphasis neutralised."""
    text = html.escape(clean_text(text, limit).replace("\n", " "), quote=False)
    for char in "\\|*_`[]#~":
        text = text.replace(char, "\\" + char)
    return text


_ICON = {"ok": "\u2705", "bad": "\u274c", "skip": "\u23ed\ufe0f", "none": "\u2014"}


def markdown_summary(summary: Summary, *, report_name: str | None = None, in_ci: bool = False) -> str:
    """The summary in Markdown; ``report_name``: the HTML page, found in the job's artifact when
    ``in_ci`` (the page is uploaded, not at hand), else a file of this machine."""
    icon = {"ok": "\u2705", "bad": "\u274c", "warn": "\u26a0\ufe0f"}.get(summary.verdict_class, "\u2753")
    out = [f"### {icon} kv harness: {summary.verdict}", ""]
    out.append(" \N{MIDDLE DOT} ".join(f"**{summary.counts[o]}** {o}" for o in _COUNTED))
    where = ", ".join(md_escape(w) for w in summary.where) or "no runs"
    out.append(f"  \nran on {where}")
    if summary.pipeline:
        pipeline = summary.pipeline  # normalized by load.read_steps
        steps = " \N{MIDDLE DOT} ".join(
            f"{md_escape(st['step'])} {st['seconds']:.1f} s" + ("" if st["ok"] else f" (exit {st['rc']})")
            for st in pipeline["steps"])
        leg = f" (leg {md_escape(pipeline['leg'], 60)})" if pipeline.get("leg") else ""
        out.append(f"  \npipeline {md_escape(pipeline['kind'])}{leg}: {steps} \N{MIDDLE DOT} "
                   f"{pipeline_total(pipeline)}")
    if summary.wall_s is not None:
        dirs = sum(len(run.parts) for run in summary.runs)
        out.append(f"  \nwall time **{fmt_duration(summary.wall_s) or '0 s'}** from the first start to the last "
                   f"end of {dirs} run director{'y' if dirs == 1 else 'ies'}")
    for run in summary.runs:
        for _, manifest in run.parts:
            line = timeline.describe(manifest.get("timeline"))
            if line:
                out.append(f"  \n{md_escape(run.label, 60)}: {md_escape(line)}")
    if summary.incomplete:
        out.append(f"  \n**incomplete run:** {', '.join(md_escape(r.label) for r in summary.incomplete)}")
    if summary.suites:
        out += ["", "| suite | " + " | ".join(md_escape(r.label, 60) for r in summary.runs) + " |",
                "|---|" + "---|" * len(summary.runs)]
        for suite in summary.suites:
            cells = []
            for cell in suite.cells:
                cells.append(_ICON["none"] if cell is None else f"{_ICON[cell.stats.status]} {cell.stats.cell_text()}")
            out.append(f"| {md_escape(suite.name)} | " + " | ".join(cells) + " |")
    failing = summary.failing()
    if failing:
        out += ["", f"**Not passing ({len(failing)})**", ""]
        for run, record in failing[:SHOWN]:
            out.append(f"- `{record.outcome}` {md_escape(record.nodeid)} on {md_escape(run.label, 60)}: "
                       f"{md_escape(first_line(record.message), 160)}")
        if len(failing) > SHOWN:
            out.append(f"- and {len(failing) - SHOWN} more")
    comparison = summary.comparison
    if comparison is not None:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(comparison.kinds().items())) or "none"
        out += ["", f"**Regressions** vs {md_escape(comparison.source)} "
                    f"(threshold {comparison.threshold_pct:g}%): {kinds}"]
        for finding in comparison.regressions[:SHOWN]:
            out.append(f"- {md_escape(_finding_text(finding), 300)}")
        apart = [f"{len(getattr(comparison, name))} {what}" for name, what in APART if getattr(comparison, name)]
        if apart:
            out += ["", f"Timing changes not counted as regressions: {md_escape('; '.join(apart), 400)}"]
        if comparison.references:
            out += ["", f"Reference measurements (baselines such as torch.compile) that moved, not "
                        f"counted as regressions: {len(comparison.references)}"]
        for note in comparison.history_notes:
            out += ["", md_escape(note, 400)]
    goals = goals_of(summary.results)
    if goals:
        out += ["", f"**Performance {goals_line(goals)}**"]
        for goal in [g for g in goals if not g.met][:SHOWN]:
            out.append(f"- missed {md_escape(describe(goal), 300)}")
    figures = md_escape("; ".join(filter(None, [checked_line(summary), tolerance_line(summary)])), 400) + "."
    out += ["", f"{figures} {md_escape(tolerance_note(summary), 400)}".rstrip()]
    if summary.n_problems:
        out += ["", f"{summary.n_problems} read problem(s): see the report."]
    if report_name:
        where = "download the job's artifact and open it" if in_ci else "open it in a browser"
        out += ["", f"Full report: {md_escape(report_name, None)} ({where})."]  # a path is no use cut short
    return "\n".join(out) + "\n"
