"""The self-contained HTML page: Jinja2 (autoescape on), inline CSS, charts as data URIs.

The page loads nothing: a Content-Security-Policy meta tag allows only inline
styles and ``data:`` images, and it carries no script.
"""

from __future__ import annotations

import os
from pathlib import Path

import jinja2

from ..measure import timeline
from ..records import STANDARD_METRICS, Record, utc_now
from . import fmt
from .charts import Trends, all_charts, trend_charts
from .goals import goals_of
from .load import BAD_OUTCOMES, Run
from .quality import quality_charts, quality_protocols, quality_rows
from .summary import TOLERANCE_NOTE, Summary, checked_of, tolerance_ratio
from .text import pipeline_total
from .tradeoff import MEMORIES_GB, MODEL, memory_rows, method_rows, tradeoff_charts

TEMPLATES = Path(__file__).resolve().parent / "templates"

# Columns of a case table, shown only when some case of the table has them.
CASE_COLUMNS = [
    ("shape", "shape", "t"),
    ("checked", "checked", "n"),
    ("bit_errors", "bit errors", "n"),
    ("max_abs_err", "max abs err", "n"),
    ("max_rel_err", "max rel err", "n"),
    ("ms", "ms", "n"),
    ("gbps", "GB/s", "n"),
    ("pct_of_peak", "% peak", "n"),
    ("speedup", "speedup", "t"),
]
_SHOWN_ELSEWHERE = {"shape", "speedup", "states_checked", "elements_checked", "bytes", "copy_gbps",
                    "error_type", "error_message", "bad_inputs", *STANDARD_METRICS}

ENV_FOLD = 160  # environment values longer than this are folded under their first half

ENV_ROWS = [
    ("leg", lambda run, s: run.leg),
    ("mode", lambda run, s: run.mode),
    ("host", lambda run, s: run.env.get("host")),
    ("GPU", lambda run, s: _gpus(run)),
    ("driver", lambda run, s: ", ".join(sorted({str(g.get("driver"))
                                                for g in run.env.get("gpus") or [] if g.get("driver")}))),
    ("CUDA (torch)", lambda run, s: run.env.get("torch_cuda")),
    ("nvcc", lambda run, s: run.env.get("nvcc")),
    ("torch", lambda run, s: run.env.get("torch")),
    ("triton", lambda run, s: run.env.get("triton")),
    ("python", lambda run, s: run.env.get("python")),
    ("numpy", lambda run, s: run.env.get("numpy")),
    ("optional packages", lambda run, s: _optional(run)),
    ("copy ceiling", lambda run, s: _ceiling(run, s)),
    ("platform", lambda run, s: run.env.get("platform")),
    ("CPU", lambda run, s: _cpu(run)),
    ("TRITON_INTERPRET", lambda run, s: run.env.get("triton_interpret")),
    ("CUDA_VISIBLE_DEVICES", lambda run, s: run.env.get("cuda_visible_devices")),
    ("commit", lambda run, s: run.env.get("commit")),
    ("CI", lambda run, s: run.env.get("ci")),
    ("started", lambda run, s: min(filter(None, run.manifest_values("started")), default=None)),
    ("finished", lambda run, s: (None if None in run.manifest_values("finished")
                                 else max(run.manifest_values("finished")))),
    ("complete", lambda run, s: "yes" if run.complete else "NO"),
    ("exit status", lambda run, s: _each(run, lambda m: m.get("exitstatus"))),
    ("where the time went", lambda run, s: _each(run, lambda m: timeline.describe(m.get("timeline")))),
    ("Triton kernels", lambda run, s: _each(run, lambda m: timeline.describe_compiles(m.get("triton_compiles")))),
    ("pytest args", lambda run, s: _each(run, lambda m: " ".join(map(str, m.get("args") or [])) or None)),
    ("source", lambda run, s: " | ".join(str(path) for path, _ in run.parts)),
]


def _optional(run: Run) -> str | None:
    """The optional packages of the run's environment (transformers, the peers): the installed
    ones with their versions, then those missing, each by name."""
    versions = run.env.get("optional")
    if not isinstance(versions, dict) or not versions:
        return None
    installed = [f"{dist} {version}" for dist, version in sorted(versions.items()) if version]
    missing = [dist for dist, version in sorted(versions.items()) if not version]
    return "; ".join(filter(None, (", ".join(installed), missing and "not installed: " + ", ".join(missing))))


def _each(run: Run, get) -> str | None:
    """``get(manifest)`` for every merged run directory, joined with `` | ``."""
    values = [get(manifest) for _, manifest in run.parts]
    return " | ".join(str(v) for v in values if v is not None) or None


_EXPECTED_TO_DIFFER = {"leg", "started", "finished", "source", "where the time went", "Triton kernels"}


def _gpus(run: Run) -> str | None:
    gpus = run.env.get("gpus") or []
    if not gpus:
        return run.env.get("gpu") or "none"
    parts = []
    for gpu in gpus:
        extra = ", ".join(
            text for text in (
                f"{gpu['sm_count']} SMs" if gpu.get("sm_count") else "",
                f"sm_{str(gpu['capability']).replace('.', '')}" if gpu.get("capability") else "",
                f"{gpu['memory_gib']} GiB" if gpu.get("memory_gib") else "",
                f"L2 {gpu['l2_mib']} MiB" if gpu.get("l2_mib") else "",
            ) if text
        )
        parts.append(f"{gpu.get('index', '?')}: {gpu.get('name')} ({extra})")
    return "; ".join(parts)


def _cpu(run: Run) -> str | None:
    cpu, count = run.env.get("cpu"), run.env.get("cpu_count")
    if not cpu and not count:
        return None
    return f"{cpu or '?'} \N{MULTIPLICATION SIGN} {count}" if count else str(cpu)


def _ceiling(run: Run, summary: Summary) -> str | None:
    value = summary.copy_ceiling(run)
    return f"{fmt.fmt_sig(value)} GB/s (device copy, read + write)" if value is not None else None


def environment_rows(summary: Summary) -> list[dict]:
    rows = []
    for name, getter in ENV_ROWS:
        values = [getter(run, summary) for run in summary.runs]
        values = [None if v in (None, "") else fmt.clean_text(v) for v in values]
        if all(v is None for v in values):
            continue
        differs = name not in _EXPECTED_TO_DIFFER and len(set(values)) > 1
        rows.append({"name": name, "values": values, "differs": differs})
    return rows


def cell_value(record: Record, column: str) -> str:
    metrics = record.metrics
    if column == "checked":
        return fmt.fmt_count(checked_of(record))
    if column == "shape":
        return fmt.clean_text(metrics.get("shape") or "", 60)
    if column == "speedup":
        speedup = metrics.get("speedup")
        if not isinstance(speedup, dict):
            return ""
        return " \N{MIDDLE DOT} ".join(f"{fmt.fmt_x(v)} {fmt.clean_text(k, 30)}" for k, v in sorted(speedup.items()))
    return fmt.fmt_metric(column, metrics.get(column))


def case_columns(records: list[Record]) -> list[tuple[str, str, str]]:
    return [col for col in CASE_COLUMNS if any(cell_value(r, col[0]) for r in records)]


def other_metrics(record: Record) -> str:
    parts = [
        f"{fmt.clean_text(k, 40)}={fmt.fmt_metric(k, v)}"
        for k, v in sorted(record.metrics.items())
        if k not in _SHOWN_ELSEWHERE and not isinstance(v, (dict, list))
    ]
    return ", ".join(parts)


# Columns of a suite's per-leg table: (Stats figure, heading), shown when some leg has a value.
LEG_COLUMNS = [("passed", "passed"), ("bad", "not passing"), ("skipped", "skipped"), ("checked", "checked"),
               ("bit_errors", "bit errors"), ("max_abs_err", "worst abs"), ("max_rel_err", "worst rel"),
               ("worst_to_tol", "error/tolerance"), ("duration_s", "duration")]


def leg_value(stats, key: str) -> str:
    """One figure of a suite on one leg (:data:`LEG_COLUMNS`), formatted; "" when it has none."""
    if key in ("passed", "skipped"):
        return str(stats.counts[key])
    if key == "bad":
        return str(stats.bad)
    if key == "worst_to_tol":
        return fmt.fmt_ratio(stats.worst_to_tol)
    if key == "checked":
        return fmt.fmt_count(stats.checked)
    return fmt.fmt_metric(key, getattr(stats, key))


def leg_columns(cells) -> list[tuple[str, str]]:
    """The columns of :data:`LEG_COLUMNS` that some cell has a value (other than 0 skipped) for."""
    def shown(key):
        values = [leg_value(cell.stats, key) for cell in cells]
        return any(values) and not (key == "skipped" and set(values) == {"0"})

    return [(key, head) for key, head in LEG_COLUMNS if shown(key)]


def case_figure(record: Record) -> str:
    """The one figure a case's cell shows beside its outcome: its time, else how near its error
    came to its tolerance, else its worst error, else how much it checked."""
    metrics = record.metrics
    if fmt.to_float(metrics.get("ms")) is not None:
        return f"{fmt.fmt_sig(metrics['ms'])} ms"
    ratio = tolerance_ratio(record)
    if ratio is not None:
        return f"{fmt.fmt_ratio(ratio)}\N{MULTIPLICATION SIGN} tol"
    if fmt.to_float(metrics.get("max_abs_err")) is not None:
        return f"err {fmt.fmt_err(metrics['max_abs_err'])}"
    checked = checked_of(record)
    return f"{fmt.fmt_count(checked)} checked" if checked is not None else ""


def case_details(record: Record) -> str:
    """Every figure of a case, ``name=value`` joined with ``, ``: the standard columns, then the rest."""
    standard = [f"{head}={value}" for key, head, _ in CASE_COLUMNS if (value := cell_value(record, key))]
    ratio = tolerance_ratio(record)
    if ratio is not None:
        standard.append(f"error/tolerance={fmt.fmt_ratio(ratio)}")
    return ", ".join(filter(None, [", ".join(standard), other_metrics(record)]))


def sorted_cases(records: list[Record]) -> list[Record]:
    """Cases that did not pass first, then in recorded order."""
    return sorted(records, key=lambda r: r.outcome not in BAD_OUTCOMES)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        count=fmt.fmt_count,
        ratio=fmt.fmt_ratio,
        err=fmt.fmt_err,
        sig=fmt.fmt_sig,
        pct=fmt.fmt_pct,
        x=fmt.fmt_x,
        dur=fmt.fmt_duration,
        spct=fmt.fmt_signed_pct,
        clean=fmt.clean_text,
        first_line=fmt.first_line,
    )
    env.globals.update(
        cell_value=cell_value,
        case_columns=case_columns,
        other_metrics=other_metrics,
        sorted_cases=sorted_cases,
        case_figure=case_figure,
        leg_columns=leg_columns,
        leg_value=leg_value,
        case_details=case_details,
        BAD_OUTCOMES=BAD_OUTCOMES,
        ENV_FOLD=ENV_FOLD,
        TOLERANCE_NOTE=TOLERANCE_NOTE,
        pipeline_total=pipeline_total,
    )
    return env


def render_html(summary: Summary, *, title: str = "kv harness report", links: dict | None = None,
                charts: dict | None = None, history: str | os.PathLike | None = None,
                trend_runs: int | None = None, trends: Trends | None = None) -> str:
    """The whole page as a string. ``links``: name -> file name of files written beside it;
    ``history``: the run history the trend charts read (none: no trend chart)."""
    if trends is None:
        trends = trend_charts(summary, history, last=trend_runs)
    template = _environment().get_template("report.html.j2")
    page = template.render(
        s=summary,
        title=title,
        generated=utc_now(),
        charts=({**all_charts(summary), "tradeoff": tradeoff_charts(summary), "quality": quality_charts(summary)}
                if charts is None else {"tradeoff": [], "quality": [], **charts}),
        quality=[(p, quality_rows(p)) for p in quality_protocols(summary)],
        memory=memory_rows(summary),
        methods=method_rows(summary),
        memory_model=MODEL,
        memories_gb=MEMORIES_GB,
        trends=trends,
        tolerance=summary.closest_to_tolerance(),
        env_rows=environment_rows(summary),
        failing=summary.failing(),
        bad_input=summary.bad_input(),
        comparison=summary.comparison,
        problems=summary.results.all_problems(),
        goals=goals_of(summary.results),
        links=links or {},
    )
    return fmt.clean_text(page)  # whatever field reached the page unfiltered, it can be written as UTF-8


def write_html(path: str | os.PathLike, html: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
