"""Charts as self-contained SVG data URIs, drawn on matplotlib ``Figure`` objects (Agg, no pyplot).

- speedup per variant and shape against each baseline (one chart per suite and baseline);
- achieved bandwidth as % of the copy bandwidth measured in the same run (GB/s when no
  ceiling was measured, e.g. in interpreter mode);
- the distribution of the worst absolute and relative errors per suite.
"""

from __future__ import annotations

import base64
import io
import math
import re
import statistics
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from ..records import Record  # noqa: E402
from .fmt import clean_text, fmt_sig, to_float  # noqa: E402
from .load import BAD_OUTCOMES  # noqa: E402
from .summary import Summary, suite_name  # noqa: E402

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
            caption = ("the time of one kernel that only reads the same bytes (harness.measure.read_floor), timed as the "
                       f"kernel is, over the kernel's time; {PASSED_ONLY}")
            charts.append(Chart("bandwidth", suite, title, caption, figure_uri(fig), f"bar chart: {title}", env,
                                "read floor"))
    return charts


def _jitter(index: int) -> float:
    return ((index * 0.6180339887) % 1.0 - 0.5) * 0.5


ERROR_FLOOR = 1e-12  # errors at or below this are drawn at the axis' left edge, with exact zeros


def error_axis_limits(values: list[float]) -> tuple[float, float]:
    """(low, high) of a log axis for errors: room around the finite ones above ERROR_FLOOR; exact
    zeros, errors at or below the floor (say 1e-157 from a float64 check) and NaN/inf are drawn
    at the edges, so that they do not stretch the axis over a hundred decades."""
    finite = [v for v in values if math.isfinite(v) and v > ERROR_FLOOR]
    return max(min(finite, default=1e-8) / 30, ERROR_FLOOR / 3), max(finite, default=1.0) * 30


def error_chart(summary: Summary) -> Chart | None:
    """Strip plot of max_abs_err and max_rel_err per suite (log scale; exact zeros and NaN marked)."""
    rows: dict[str, dict[str, list[tuple[float, bool]]]] = {}
    for _, record in summary.results.pairs():
        for metric in ("max_abs_err", "max_rel_err"):
            value = to_float(record.metrics.get(metric))
            if value is not None:
                bad = record.outcome in BAD_OUTCOMES
                rows.setdefault(metric, {}).setdefault(suite_name(record), []).append((value, bad))
    if not rows:
        return None
    suites = sorted({s for data in rows.values() for s in data})
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, min(MAX_HEIGHT_IN, 1.3 + 0.32 * len(suites))), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True, squeeze=False)[0]
        for ax, metric in zip(axes, ("max_abs_err", "max_rel_err"), strict=True):
            data = rows.get(metric, {})
            low, high = error_axis_limits([v for pts in data.values() for v, _ in pts])
            for y, suite in enumerate(suites):
                points = data.get(suite, [])
                for i, (value, bad) in enumerate(points):
                    if math.isnan(value) or math.isinf(value):
                        x, marker, color = high, "^", "#cf222e"
                    elif value <= ERROR_FLOOR:
                        x, marker, color = low, "|", "#cf222e" if bad else "#6e7781"
                    else:
                        x, marker, color = value, "o", "#cf222e" if bad else "#1f6feb"
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
        fig.text(0.01, -0.02, "dot: one case (red: failed) \N{MIDDLE DOT} bar at left: 0 or below 1e-12 "
                 "\N{MIDDLE DOT} triangle at right: NaN/inf", fontsize=6.5, color="#424a53")
    return Chart("errors", "", "Worst errors per case", "max_abs_err and max_rel_err of every case that reports them",
                 figure_uri(fig), "strip plot of worst absolute and relative errors per suite")


def all_charts(summary: Summary) -> dict[str, list[Chart]]:
    errors = error_chart(summary)
    return {
        "speedup": speedup_charts(summary),
        "bandwidth": bandwidth_charts(summary),
        "errors": [errors] if errors else [],
    }
