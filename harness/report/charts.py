"""Charts as self-contained SVG data URIs, drawn on matplotlib ``Figure`` objects (Agg, no pyplot).

- speedup per variant and shape against each baseline (one chart per suite and baseline);
- achieved bandwidth as % of the copy bandwidth measured in the same run (GB/s when no
  ceiling was measured, e.g. in interpreter mode);
- the distribution of the worst absolute and relative errors per suite;
- trends: each benchmark case's time over the last runs of its leg and GPU in the run history
  (harness.history), with its noise band and change points (:func:`change_points` says the rule).
"""

from __future__ import annotations

import base64
import io
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from .. import history  # noqa: E402
from ..measure.noise import MAD_TO_SIGMA  # noqa: E402
from ..records import Record  # noqa: E402
from .fmt import clean_text, fmt_err, fmt_sig, to_float  # noqa: E402
from .load import BAD_OUTCOMES, Run  # noqa: E402
from .summary import Summary, is_reference, suite_name  # noqa: E402

PALETTE = ["#1f6feb", "#e36209", "#2da44e", "#8250df", "#cf222e", "#0598bc", "#bf8700", "#6e7781",
           "#d2a8ff", "#57ab5a"]
RC = {
    "svg.fonttype": "none",  # text stays text: small, crisp, selectable
    "svg.hashsalt": "kvh-report",  # deterministic element ids
    "font.size": 8,
    "font.family": "DejaVu Sans",
    "axes.edgecolor": "#8c959f",
    "axes.linewidth": 0.6,
    "axes.titlesize": 9,
    "xtick.color": "#424a53",
    "ytick.color": "#424a53",
    "grid.color": "#d8dee4",
    "grid.linewidth": 0.5,
}
MAX_HEIGHT_IN = 14.0
PASSED_ONLY = "passed cases only"  # what the speed and bandwidth charts draw (captions say it)


@dataclass
class Chart:
    kind: str  # "speedup", "bandwidth", "errors"
    suite: str
    title: str
    caption: str
    uri: str
    alt: str
    env: str = ""
    baseline: str = ""


def _chart_order(chart: Chart):
    """Suite by suite; GPU environments before interpreter ones; then baseline name."""
    return chart.suite, not chart.env.startswith("gpu/"), chart.env, chart.baseline


def figure_uri(fig: Figure) -> str:
    """The figure as an ``data:image/svg+xml;base64,...`` URI."""
    buffer = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _natural(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _impl(record: Record) -> str:
    return "/".join(p for p in (record.backend, record.variant) if p) or record.case


def _shape(record: Record) -> str:
    shape = record.metrics.get("shape")
    return str(shape) if shape not in (None, "") else ""


def leg_colors(summary: Summary) -> dict[str, str]:
    """One color per leg, the same in every chart."""
    return {run.label: PALETTE[i % len(PALETTE)] for i, run in enumerate(summary.runs)}


def grouped_barh(rows, series, colors, *, xlabel, log=False, origin=0.0, refline=None,
                 reflabel=None, value_text=fmt_sig) -> Figure:
    """Horizontal bars, one row per (shape, implementation), one bar per series (leg) in a row.

    ``rows`` is a list of (shape, implementation); rows of one shape sit under a bold shape
    heading. ``series`` maps a leg label to {row: value} and ``colors`` a leg label to its color
    (the page prints the chart's title above the image). Bars start at ``origin``: with
    ``log`` and origin 1 (speedups) they grow left when slower and right when faster. Labels
    are drawn through :func:`clean_text` (the font renderer refuses lone surrogates).
    """
    with matplotlib.rc_context(RC):
        n_ser = max(1, len(series))
        ticks, labels, bold, y_of = [], [], [], {}
        y = 0.0
        for shape in dict.fromkeys(shape for shape, _ in rows):
            if shape:
                ticks.append(y)
                labels.append(clean_text(shape))
                bold.append(True)
                y += 0.75
            for row in (r for r in rows if r[0] == shape):
                y_of[row] = y
                ticks.append(y)
                labels.append(clean_text(("  " if shape else "") + row[1]))
                bold.append(False)
                y += 1.0
        rows_h = 0.13 * n_ser + 0.1
        height = min(MAX_HEIGHT_IN, 0.95 + y * rows_h)
        fig = Figure(figsize=(6.4, height), layout="constrained")
        ax = fig.add_subplot()
        bar = 0.8 / n_ser
        values = [v for data in series.values() for v in data.values()]
        for s_index, (label, data) in enumerate(series.items()):
            points = [(y_of[row] + (s_index - (n_ser - 1) / 2) * bar, data[row]) for row in rows if row in data]
            ys = [p[0] for p in points]
            vals = [p[1] for p in points]
            ax.barh(ys, [v - origin for v in vals], left=origin, height=bar * 0.9, color=colors.get(label),
                    label=clean_text(label))
            for yy, value in points:
                right = value >= origin
                ax.annotate(value_text(value), (value, yy), xytext=(3 if right else -3, 0),
                            textcoords="offset points", va="center", ha="left" if right else "right",
                            fontsize=6, color="#24292f")
        if log:
            ax.set_xscale("log")
            low, high = min([origin, *values]) / 2.2, max([origin, *values]) * 2.2
            ax.set_xlim(low, high)
            subs = (1.0, 2.0, 5.0) if math.log10(high / low) <= 2.5 else (1.0,)
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}\N{MULTIPLICATION SIGN}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xlim(min(0.0, *values), max([refline or 0.0, *values, 1e-9]) * 1.15)
        if refline is not None:
            ax.axvline(refline, color="#24292f", linewidth=0.8, linestyle="--")
            if reflabel:
                ax.annotate(reflabel, (refline, 1.0), xycoords=("data", "axes fraction"), xytext=(-2, 2),
                            textcoords="offset points", ha="right", fontsize=6.5, color="#424a53")
        ax.set_yticks(ticks, labels=labels)
        for tick, is_bold in zip(ax.get_yticklabels(), bold, strict=True):
            if is_bold:
                tick.set_fontweight("bold")
                tick.set_color("#1f2328")
        ax.tick_params(axis="y", length=0)
        ax.set_ylim(y - 0.4, -0.6)
        ax.set_xlabel(clean_text(xlabel))
        ax.grid(axis="x", which="major")
        ax.set_axisbelow(True)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        if len(series) > 1:
            ax.legend(fontsize=6.5, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0),
                      ncols=min(3, len(series)), handlelength=1.0)
        return fig


def _collect(summary: Summary, value_of):
    """environment -> suite -> leg -> (shape, implementation) -> values, where ``value_of`` gives one.

    Only cases that passed count: the figures of a failed, crashed or timed-out case are no
    measurement of a working kernel."""
    out: dict = {}
    for run, record in summary.results.pairs():
        if record.outcome != "passed":
            continue
        value = value_of(record)
        if value is None or not math.isfinite(value):
            continue
        leg = out.setdefault(run.environment_key, {}).setdefault(suite_name(record), {}).setdefault(run.label, {})
        leg.setdefault((_shape(record), _impl(record)), []).append(value)
    return out


def _reduce(legs: dict):
    """Rows in natural order and the median of repeated values per (leg, row)."""
    rows = sorted({row for data in legs.values() for row in data}, key=lambda r: (_natural(r[0]), _natural(r[1])))
    return rows, {leg: {row: statistics.median(v) for row, v in data.items()} for leg, data in legs.items()}


def _env_text(env: str) -> str:
    mode, _, gpu = env.partition("/")
    return f"{gpu}, {mode}" if gpu != "cpu" else f"CPU, {mode}"


def speedup_charts(summary: Summary) -> list[Chart]:
    baselines = sorted({
        str(name)
        for _, r in summary.results.pairs()
        if isinstance(r.metrics.get("speedup"), dict)
        for name in r.metrics["speedup"]
    })
    colors = leg_colors(summary)
    charts = []
    for baseline in baselines:
        def value_of(record, baseline=baseline):
            speedup = record.metrics.get("speedup")
            value = to_float(speedup.get(baseline)) if isinstance(speedup, dict) else None
            return value if value is not None and value > 0 else None

        for env, suites in _collect(summary, value_of).items():
            for suite, legs in suites.items():
                rows, series = _reduce(legs)
                title = f"{suite}: speedup over {baseline} ({_env_text(env)})"
                fig = grouped_barh(rows, series, colors, log=True, origin=1.0, refline=1.0,
                                   xlabel=f"speedup over {baseline}, log scale (right of 1 = faster)",
                                   value_text=lambda v: f"{fmt_sig(v)}\N{MULTIPLICATION SIGN}")
                caption = f"{baseline} ms / kernel ms; median of repeats; {PASSED_ONLY}"
                charts.append(Chart("speedup", suite, title, caption, figure_uri(fig), f"bar chart: {title}", env,
                                    baseline))
    return sorted(charts, key=_chart_order)


def bandwidth_charts(summary: Summary) -> list[Chart]:
    colors = leg_colors(summary)
    pct = _collect(summary, lambda r: to_float(r.metrics.get("pct_of_peak")))
    gbps = _collect(summary, lambda r: to_float(r.metrics.get("gbps")))
    charts = []
    for env in sorted(set(pct) | set(gbps)):
        for suite in sorted(set(pct.get(env, {})) | set(gbps.get(env, {}))):
            if suite in pct.get(env, {}):
                rows, series = _reduce(pct[env][suite])
                title = f"{suite}: % of measured copy bandwidth ({_env_text(env)})"
                fig = grouped_barh(rows, series, colors, refline=100.0, reflabel="copy peak",
                                   xlabel="% of the device copy bandwidth measured in the same run",
                                   value_text=lambda v: f"{v:.0f}%")
                caption = ("fewest bytes the operation must move / time, against a device copy in the same run; "
                           + PASSED_ONLY)
            else:
                rows, series = _reduce(gbps[env][suite])
                title = f"{suite}: achieved GB/s ({_env_text(env)})"
                fig = grouped_barh(rows, series, colors, xlabel="GB/s")
                caption = f"no copy ceiling measured in this mode (no GPU): absolute GB/s; {PASSED_ONLY}"
            charts.append(Chart("bandwidth", suite, title, caption, figure_uri(fig), f"bar chart: {title}", env))
    charts += read_floor_charts(summary, colors)
    return sorted(charts, key=_chart_order)


def read_floor_charts(summary: Summary, colors) -> list[Chart]:
    """Per suite and environment whose cases record ``pct_of_read_floor`` (harness.measure.read_floor): the
    kernel's speed as a percentage of one kernel that only reads the same bytes, timed alike."""
    floor = _collect(summary, lambda r: to_float(r.metrics.get("pct_of_read_floor")))
    charts = []
    for env, suites in floor.items():
        for suite, legs in suites.items():
            rows, series = _reduce(legs)
            title = f"{suite}: % of the read floor ({_env_text(env)})"
            fig = grouped_barh(rows, series, colors, refline=100.0, reflabel="read floor",
                               xlabel="read floor ms / kernel ms, as %", value_text=lambda v: f"{v:.0f}%")
            caption = ("the time of one kernel that only reads the same bytes (harness.measure.read_floor), "
                       f"timed as the kernel is, over the kernel's time; {PASSED_ONLY}")
            charts.append(Chart("bandwidth", suite, title, caption, figure_uri(fig), f"bar chart: {title}", env,
                                "read floor"))
    return charts


def _jitter(index: int) -> float:
    return ((index * 0.6180339887) % 1.0 - 0.5) * 0.5


ERROR_FLOOR = 1e-12  # errors at or below this are drawn at the axis' left edge, with exact zeros
# Errors more than this many decades above the median of their panel are drawn at the right edge
# and named in the caption: a round trip of inputs near 1e30 (errors near 1e29, within its bound)
# would otherwise stretch the axis of every other case over thirty decades.
OFF_AXIS_DECADES = 6
OFF_AXIS_NAMED = 6  # off-axis cases named in the caption before "and N more"


def _on_scale(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v) and v > ERROR_FLOOR]


def error_fence(values: list[float]) -> float:
    """The largest error an error axis spans: OFF_AXIS_DECADES decades above the median of the
    finite errors above ERROR_FLOOR (inf when there is none); larger errors are off the axis."""
    logs = [math.log10(v) for v in _on_scale(values)]
    return 10.0 ** (statistics.median(logs) + OFF_AXIS_DECADES) if logs else math.inf


def error_axis_limits(values: list[float]) -> tuple[float, float]:
    """(low, high) of a log axis for errors: room around the finite ones above ERROR_FLOOR and up to
    :func:`error_fence`; exact zeros, errors at or below the floor (say 1e-157 from a float64 check),
    errors past the fence and NaN/inf are drawn at the edges, so that they do not stretch the axis
    over tens of decades."""
    fence = error_fence(values)
    bulk = [v for v in _on_scale(values) if v <= fence]
    return max(min(bulk, default=1e-8) / 30, ERROR_FLOOR / 3), max(bulk, default=1.0) * 30


def error_legend(off_axis: bool) -> list[Line2D]:
    """What the error chart's marks mean, as legend entries (drawn inside the figure)."""
    def mark(marker, color, label):
        return Line2D([], [], marker=marker, markersize=4, color=color, linestyle="none", label=label)

    marks = [mark("o", "#1f6feb", "one case"), mark("o", "#cf222e", "a case that failed"),
             mark("|", "#6e7781", "0 or below 1e-12 (left edge)"), mark("^", "#cf222e", "NaN/inf (right edge)")]
    if off_axis:
        marks.append(mark(">", "#6e7781", f"over 1e{OFF_AXIS_DECADES}\N{MULTIPLICATION SIGN} the median "
                                          "(right edge, named below)"))
    return marks


def _error_mark(value: float, bad: bool, low: float, high: float, fence: float) -> tuple[float, str, str]:
    """Where and how one error is drawn: (x, marker, color)."""
    if math.isnan(value) or math.isinf(value):
        return high, "^", "#cf222e"
    if value <= ERROR_FLOOR:
        return low, "|", "#cf222e" if bad else "#6e7781"
    if value > fence:
        return high, ">", "#cf222e" if bad else "#6e7781"
    return value, "o", "#cf222e" if bad else "#1f6feb"


def _off_axis_text(off_axis: list[tuple[str, float, str]]) -> str:
    """``; off the axis (...): max_abs_err 4.61e+29 suite::case, ...`` or "" when none is."""
    if not off_axis:
        return ""
    named = [f"{metric} {fmt_err(value)} {where}" for metric, value, where in off_axis[:OFF_AXIS_NAMED]]
    more = f" and {len(off_axis) - OFF_AXIS_NAMED} more" if len(off_axis) > OFF_AXIS_NAMED else ""
    return (f"; off the axis (over 1e{OFF_AXIS_DECADES}\N{MULTIPLICATION SIGN} their panel's median error, "
            f"drawn at its right edge): {', '.join(named)}{more}")


def error_chart(summary: Summary) -> Chart | None:
    """Strip plot of max_abs_err and max_rel_err per suite (log scale; exact zeros, NaN and errors
    far above the rest marked at the edges, the latter named in the caption)."""
    rows: dict[str, dict[str, list[tuple[float, bool, str]]]] = {}
    for run, record in summary.results.pairs():
        for metric in ("max_abs_err", "max_rel_err"):
            value = to_float(record.metrics.get(metric))
            if value is not None:
                bad = record.outcome in BAD_OUTCOMES
                where = f"{suite_name(record)}::{record.case}" + (f" on {run.label}" if len(summary.runs) > 1 else "")
                rows.setdefault(metric, {}).setdefault(suite_name(record), []).append((value, bad, where))
    if not rows:
        return None
    suites = sorted({s for data in rows.values() for s in data})
    off_axis: list[tuple[str, float, str]] = []
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, min(MAX_HEIGHT_IN, 1.3 + 0.32 * len(suites))), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True, squeeze=False)[0]
        for ax, metric in zip(axes, ("max_abs_err", "max_rel_err"), strict=True):
            data = rows.get(metric, {})
            values = [v for pts in data.values() for v, _, _ in pts]
            low, high = error_axis_limits(values)
            fence = error_fence(values)
            for y, suite in enumerate(suites):
                for i, (value, bad, where) in enumerate(data.get(suite, [])):
                    x, marker, color = _error_mark(value, bad, low, high, fence)
                    if marker == ">":
                        off_axis.append((metric, value, where))
                    ax.plot([x], [y + _jitter(i)], marker=marker, markersize=3.2, color=color, alpha=0.75,
                            linestyle="none")
            ax.set_xscale("log")
            ax.set_xlim(low / 1.5, high * 1.5)
            ax.set_title(metric, loc="left")
            ax.grid(axis="x")
            ax.set_axisbelow(True)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        axes[0].set_yticks(range(len(suites)), labels=[clean_text(suite) for suite in suites])
        axes[0].set_ylim(len(suites) - 0.5, -0.5)
        # five marks as rows of three: a row of four with the long fifth under it is wider than the figure
        fig.legend(handles=error_legend(bool(off_axis)), loc="outside lower center", ncols=3 if off_axis else 4,
                   frameon=False, fontsize=6.5, handletextpad=0.3, columnspacing=1.2)
    caption = "max_abs_err and max_rel_err of every case that reports them" + _off_axis_text(off_axis)
    return Chart("errors", "", "Worst errors per case", caption, figure_uri(fig),
                 "strip plot of worst absolute and relative errors per suite")


def all_charts(summary: Summary) -> dict[str, list[Chart]]:
    errors = error_chart(summary)
    return {
        "speedup": speedup_charts(summary),
        "bandwidth": bandwidth_charts(summary),
        "errors": [errors] if errors else [],
    }


# -- trends over the run history ---------------------------------------------------------------

TREND_RUNS = 10  # runs of a leg drawn per case (the report's --trend-runs)
TREND_METRIC = "ms"
BAND_WINDOW = 5  # the runs before a run that make its noise band ...
BAND_MIN_RUNS = 3  # ... at least this many, else it has no band and is no change point
BAND_SPREADS = 3.0  # half-width of the band in robust standard deviations (1.4826 x MAD) ...
BAND_FLOOR = 0.10  # ... and at least this fraction of the median: visits to one GPU model differ by up to 10%
MAX_TREND_CASES = 12  # cases per chart; a suite with more gets several charts
HISTORY_TIMEOUT_S = 2.0  # a history locked longer than this is left out of the report
CHANGE_RULE = (f"the band is the median \N{PLUS-MINUS SIGN} max({BAND_SPREADS:g} robust SD, {BAND_FLOOR:.0%}) of "
               f"the up to {BAND_WINDOW} runs before (at least {BAND_MIN_RUNS}); a run outside it is a change point")


@dataclass
class Trends:
    """The trend charts and one line: what they show, or why there is none."""

    charts: list[Chart] = field(default_factory=list)
    note: str = ""


def noise_band(values: list[float]) -> tuple[float, float] | None:
    """(low, high): the median of ``values`` plus and minus the larger of BAND_SPREADS robust
    standard deviations (1.4826 x the median absolute deviation) and BAND_FLOOR of the median;
    None for fewer than BAND_MIN_RUNS values."""
    if len(values) < BAND_MIN_RUNS:
        return None
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    half = max(BAND_SPREADS * MAD_TO_SIGMA * mad, BAND_FLOOR * abs(median))
    return median - half, median + half


def run_bands(values: list[float | None]) -> list[tuple[float, float] | None]:
    """Each run's band: :func:`noise_band` of the up to BAND_WINDOW runs before it that have a value."""
    bands = []
    for index in range(len(values)):
        before = [v for v in values[:index] if v is not None and math.isfinite(v)]
        bands.append(noise_band(before[-BAND_WINDOW:]))
    return bands


def change_points(values: list[float | None]) -> list[int]:
    """The runs whose value leaves the band of the runs before it (:func:`run_bands`): a run that
    moved the case's time beyond the noise of its recent past."""
    return [i for i, (value, band) in enumerate(zip(values, run_bands(values), strict=True))
            if value is not None and band is not None and not band[0] <= value <= band[1]]


def _trend_legend() -> list:
    return [Line2D([], [], marker="o", markersize=3, color=PALETTE[0], label=f"{TREND_METRIC} per run"),
            Patch(color=PALETTE[0], alpha=0.18, label="noise band of the runs before"),
            Line2D([], [], marker="o", markersize=7, markerfacecolor="none", markeredgecolor="#cf222e",
                   linestyle="none", label="change point")]


def _draw_trend(ax, values: list[float | None]) -> None:
    xs = range(len(values))
    ys = [math.nan if v is None else v for v in values]
    ax.plot(xs, ys, marker="o", markersize=3, color=PALETTE[0], linewidth=1.0)
    for x, band in zip(xs, run_bands(values), strict=True):
        if band is not None:
            ax.fill_between([x - 0.45, x + 0.45], band[0], band[1], color=PALETTE[0], alpha=0.18, linewidth=0)
    changes = change_points(values)
    ax.plot(changes, [values[i] for i in changes], marker="o", markersize=7, markerfacecolor="none",
            markeredgecolor="#cf222e", markeredgewidth=1.2, linestyle="none")
    ax.grid(axis="y")
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", labelsize=6.5)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def trend_figure(labels: list[str], cases: list[tuple[str, list[float | None]]]) -> Figure:
    """One row per case (title: the case), the runs along x labelled by ``labels`` (commits)."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, min(MAX_HEIGHT_IN, 0.75 + 0.95 * len(cases))), layout="constrained")
        axes = fig.subplots(len(cases), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (name, values) in zip(axes, cases, strict=True):
            _draw_trend(ax, values)
            ax.set_title(clean_text(name, 90), loc="left", fontsize=7)
            ax.set_ylabel(TREND_METRIC, fontsize=6.5)
        axes[-1].set_xticks(range(len(labels)), labels=[clean_text(label, 12) for label in labels], fontsize=6.5)
        axes[-1].set_xlim(-0.6, len(labels) - 0.4)
        fig.legend(handles=_trend_legend(), loc="outside lower center", ncols=3, frameon=False, fontsize=6.5)
        return fig


def _case_name(record: Record) -> str:
    """The case id, with its variant when the id does not already name it."""
    if record.variant and record.variant not in record.case:
        return f"{record.case} {record.variant}"
    return record.case


def _current_values(run: Run) -> dict[tuple[str, str | None], dict]:
    """This run's benchmark cases (not the baselines timed beside them): (nodeid, variant) ->
    {"suite", "name", "value"}, value the median time of its passed records (None if none passed)."""
    found: dict[tuple[str, str | None], dict] = {}
    for record in run.records:
        if to_float(record.metrics.get(TREND_METRIC)) is None or is_reference(record):
            continue
        case = found.setdefault((record.nodeid, record.variant), {"suite": suite_name(record), "values": [],
                                                                  "name": _case_name(record)})
        value = to_float(record.metrics[TREND_METRIC])
        if record.outcome == "passed" and value is not None and math.isfinite(value):
            case["values"].append(value)
    for case in found.values():
        values = case.pop("values")
        case["value"] = statistics.median(values) if values else None
    return found


def _leg_trends(run: Run, path: history.Location, last: int) -> tuple[list[Chart], str]:
    """The charts of one leg, or why it has none."""
    current = _current_values(run)
    if not current:
        return [], ""
    runs, series = history.case_series(TREND_METRIC, leg=run.leg, gpu=run.gpu, last=last,
                                       nodeids={nodeid for nodeid, _ in current}, path=path,
                                       timeout_s=HISTORY_TIMEOUT_S)
    labels = [(r["commit"] or "?")[:7] for r in runs]
    mine = {history.run_key(manifest, Path(source)) for source, manifest in run.parts}
    fresh = not mine & {r["run_id"] for r in runs}  # this run is not in the history yet
    if fresh:
        labels.append("this run")
    labels = labels[-last:]
    if len(labels) < 2:
        return [], f"{run.label}: {len(runs)} run(s) of its leg and GPU in the history"
    by_suite: dict[str, list[tuple[str, list[float | None]]]] = {}
    for key, case in sorted(current.items(), key=lambda item: (item[1]["suite"], _natural(item[1]["name"]))):
        values = series.get(key, [None] * len(runs)) + ([case["value"]] if fresh else [])
        by_suite.setdefault(case["suite"], []).append((case["name"], values[-last:]))
    charts = []
    for suite, cases in by_suite.items():
        for start in range(0, len(cases), MAX_TREND_CASES):
            chunk = cases[start:start + MAX_TREND_CASES]
            part = f" ({start // MAX_TREND_CASES + 1})" if len(cases) > MAX_TREND_CASES else ""
            title = f"{suite}{part}: {TREND_METRIC} over the last {len(labels)} runs ({run.label}, {run.gpu or 'CPU'})"
            charts.append(Chart("trend", suite, title, f"x: the commit of each run, oldest left; {CHANGE_RULE}",
                                figure_uri(trend_figure(labels, chunk)), f"line charts: {title}", run.environment_key))
    return charts, ""


def trend_charts(summary: Summary, path: str | os.PathLike | None, *, last: int | None = None) -> Trends:
    """Each benchmark case of the report over the newest ``last`` runs of its leg and GPU in the run
    history at ``path`` (and this run, when the history does not hold it yet). A history that is
    missing, locked or unreadable gives no chart and a line saying why; it never stops the report."""
    last = TREND_RUNS if last is None else last
    if path is None:
        return Trends(note="no run history given (python -m harness report --history PATH)")
    path = history.as_location(path)
    where = history.shown(path)
    charts, short = [], []
    for run in summary.runs:
        try:
            drawn, why = _leg_trends(run, path, last)
        except history.HistoryMissing:
            return Trends(note=f"no run history at {where}")
        except history.HistoryError as exc:
            return Trends(note=str(exc))
        charts += drawn
        short += [why] if why else []
    if not charts:
        reason = "; ".join(short) if short else "no benchmark case in this report"
        return Trends(note=f"fewer than 2 runs to draw ({reason}; history {where})" if short else reason)
    note = (f"{TREND_METRIC} of each benchmark case over the last runs of its leg and GPU in {where}; {CHANGE_RULE}"
            + (f". Not drawn: {'; '.join(short)}" if short else ""))
    return Trends(charts, note)
