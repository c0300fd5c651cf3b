"""Baselines: a summary JSON of one result set, and the comparison of a later one against it.

Format (``reports/baselines/<name>.json``)::

    {
      "format": "kvh-baseline", "version": 1,
      "created": ISO-8601 UTC, "threshold_pct": 10.0,
      "source": {"legs": [...], "environments": ["gpu/NVIDIA H200", ...],
                 "commits": [...], "hosts": [...]},
      "cases": {
        "<group/suite>::<case>::<backend or ->::<variant or ->": {
          "suite": str, "case": str, "backend": str|null, "variant": str|null,
          "env": "gpu/NVIDIA H200",          # mode/GPU the figures were measured on
          "legs": [str, ...],                 # legs that contributed
          "outcome": "passed" | ...,          # worst outcome over those legs
          "ms": float, "gbps": float, "pct_of_peak": float,       # medians over legs
          "max_abs_err": float, "max_rel_err": float, "bit_errors": float,  # worst over legs
          "static": {"triton X.Y.Z": {"instructions_per_element": float, "registers": int, ...}}
        }, ...
      }
    }

A record whose metrics say ``"reference": true`` is a reference measurement, a baseline a
benchmark times beside the kernels (torch.compile, the INT8 C++ CPU baseline): its timing and error
changes are listed as references moved, not as regressions of the kernels (a new failure still
is one).

The key leaves the leg out, so one baseline serves every version leg. When the
result set mixes environments, each case keeps the figures of its preferred one
(GPU runs over interpreter runs, then the one with most records). Timings and
errors are only compared between runs of the same environment; new failures are
flagged everywhere.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..records import BASELINE_FORMAT, OUTCOMES, Record, utc_now, write_json_atomic
from .fmt import clean_text, to_float
from .load import BAD_OUTCOMES, ResultSet, Run
from .summary import ERROR_METRICS, is_reference, suite_name, worst

FORMAT = BASELINE_FORMAT
VERSION = 1
DEFAULT_THRESHOLD_PCT = 10.0
DEFAULT_ERROR_FACTOR = 2.0
TIMING_METRICS = ("ms", "gbps", "pct_of_peak")
# Figures of a kernel's machine code (suites/test_sass_budget.py): the same on every machine for
# one triton release, so compared per triton release in any environment, where timings are not.
STATIC_METRICS = ("instructions_per_element", "loop_instructions", "registers", "stack_bytes")
# Outcomes from least to most severe: a key's baseline outcome is its worst.
_SEVERITY = {o: i for i, o in enumerate(("skipped", "passed", "failed", "error", "timeout", "crashed"))}
assert set(_SEVERITY) == set(OUTCOMES)


def case_key(record: Record) -> str:
    """Leg-independent identity of a case: suite, case id, backend, variant."""
    return "::".join((suite_name(record), record.case, record.backend or "-", record.variant or "-"))


def _median(values) -> float | None:
    numbers = [v for v in (to_float(x) for x in values) if v is not None and math.isfinite(v)]
    return statistics.median(numbers) if numbers else None


def _entry(records: list[tuple[Run, Record]]) -> dict:
    first = records[0][1]
    passed = [r for _, r in records if r.outcome == "passed"] or [r for _, r in records]
    entry = {
        "suite": suite_name(first),
        "case": first.case,
        "backend": first.backend,
        "variant": first.variant,
        "env": records[0][0].environment_key,
        "legs": sorted({run.leg for run, _ in records}),
        "outcome": max((r.outcome for _, r in records), key=_SEVERITY.__getitem__),
    }
    for name in TIMING_METRICS:
        value = _median(r.metrics.get(name) for r in passed)
        if value is not None:
            entry[name] = value
    for name in (*ERROR_METRICS, "bit_errors"):
        value = worst(r.metrics.get(name) for r in passed)
        if value is not None:
            entry[name] = value if math.isfinite(value) else str(value)
    return entry


def codegen_key(run: Run) -> str:
    """What a kernel's machine code depends on besides its source: the triton release."""
    return f"triton {run.env.get('triton') or run.leg}"


def _static_figures(pairs) -> dict:
    """triton release -> {static metric: value} over the passed records of every environment."""
    out: dict[str, dict] = {}
    for run, record in pairs:
        if record.outcome != "passed":
            continue
        figures = {m: to_float(record.metrics.get(m)) for m in STATIC_METRICS}
        figures = {m: v for m, v in figures.items() if v is not None and math.isfinite(v)}
        if figures:
            out.setdefault(codegen_key(run), figures)
    return out


def make_baseline(results: ResultSet, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> dict:
    env_weight = Counter()
    for run in results.runs:
        env_weight[run.environment_key] += len(run.records)

    def preference(env: str):
        return (not env.startswith("gpu/"), -env_weight[env], env)

    grouped: dict[str, dict[str, list[tuple[Run, Record]]]] = {}
    for run, record in results.pairs():
        grouped.setdefault(case_key(record), {}).setdefault(run.environment_key, []).append((run, record))
    cases = {}
    for key in sorted(grouped):
        env = min(grouped[key], key=preference)
        cases[key] = _entry(grouped[key][env])
        static = _static_figures(pair for pairs in grouped[key].values() for pair in pairs)
        if static:
            cases[key]["static"] = static
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": utc_now(),
        "threshold_pct": threshold_pct,
        "source": {
            "legs": sorted({run.leg for run in results.runs}),
            "environments": sorted(env_weight, key=preference),
            "commits": sorted({str(run.env.get("commit")) for run in results.runs if run.env.get("commit")}),
            "hosts": sorted({run.host for run in results.runs}),
        },
        "cases": cases,
    }


def write_baseline(path: str | os.PathLike, results: ResultSet, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> dict:
    data = make_baseline(results, threshold_pct)
    write_json_atomic(path, data)
    return data


def read_baseline(path: str | os.PathLike) -> dict:
    """Load and check a baseline file; ValueError naming the file and the problem otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"baseline {path}: cannot read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ValueError(f"baseline {path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"baseline {path}: expected a JSON object with format={FORMAT!r}")
    if data.get("version") != VERSION:
        raise ValueError(f"baseline {path}: expected version {VERSION}, got {data.get('version')!r}")
    if not isinstance(data.get("cases"), dict):
        raise ValueError(f"baseline {path}: expected a 'cases' object")
    return data


@dataclass
class Finding:
    kind: str  # "slower", "faster", "timing lost", "new failure", "error grew", "static grew", "static shrank"
    key: str
    run_label: str
    suite: str
    case: str
    backend: str | None
    variant: str | None
    metric: str
    baseline: object
    current: object
    change_pct: float | None = None
    note: str = ""


@dataclass
class Comparison:
    source: str
    created: str | None
    threshold_pct: float
    error_factor: float
    environments: list[str]
    regressions: list[Finding] = field(default_factory=list)
    improvements: list[Finding] = field(default_factory=list)
    new_cases: list[str] = field(default_factory=list)
    missing_cases: list[str] = field(default_factory=list)
    not_comparable: list[str] = field(default_factory=list)  # run labels: other mode or GPU
    references: list[Finding] = field(default_factory=list)  # timings / errors of reference measurements
    compared: int = 0

    def kinds(self) -> Counter:
        return Counter(f.kind for f in self.regressions)


def _finding(kind, key, run, record, metric, base, cur, change=None, note="") -> Finding:
    return Finding(kind, key, run.label, suite_name(record), record.case, record.backend,
                   record.variant, metric, base, cur, change, note)


def _timing(value) -> float | None:
    """A time or bandwidth that can be compared: finite and positive; else None."""
    number = to_float(value)
    return number if number is not None and math.isfinite(number) and number > 0 else None


def _timing_finding(key, run, record, entry, threshold_pct) -> Finding | None:
    """ms against the baseline's ms, else GB/s against its GB/s. A case whose baseline had a
    time or bandwidth but that now has neither (NaN, 0 or none recorded) has lost its timing."""
    base_ms, cur_ms = _timing(entry.get("ms")), _timing(record.metrics.get("ms"))
    base_bw, cur_bw = _timing(entry.get("gbps")), _timing(record.metrics.get("gbps"))
    if base_ms and cur_ms:
        metric, base, cur, change = "ms", base_ms, cur_ms, (cur_ms / base_ms - 1.0) * 100.0
    elif base_bw and cur_bw:
        metric, base, cur, change = "gbps", base_bw, cur_bw, (base_bw / cur_bw - 1.0) * 100.0
    elif base_ms or base_bw:
        metric = "ms" if base_ms else "gbps"
        now = record.metrics.get(metric)
        note = "none recorded now" if now is None else "no finite positive figure now"
        return _finding("timing lost", key, run, record, metric, base_ms or base_bw, now, None, note)
    else:
        return None
    if change > threshold_pct:
        return _finding("slower", key, run, record, metric, base, cur, change)
    if change < -threshold_pct:
        return _finding("faster", key, run, record, metric, base, cur, change)
    return None


def _error_findings(key, run, record, entry, factor) -> list[Finding]:
    out = []
    for name in (*ERROR_METRICS, "bit_errors"):
        base, cur = to_float(entry.get(name)), to_float(record.metrics.get(name))
        if base is None or cur is None or math.isnan(base):
            continue
        if math.isnan(cur):
            grew, note = True, "now NaN"
        elif base == 0:
            grew, note = cur > 0, "was exact"
        else:
            grew, note = cur > base * factor, f"over {factor:g}x the baseline"
        if grew:
            change = None if base == 0 or math.isnan(cur) else (cur / base - 1.0) * 100.0
            out.append(_finding("error grew", key, run, record, name, base, cur, change, note))
    return out


def _static_findings(key, run, record, entry, threshold_pct) -> list[Finding]:
    """Machine-code figures against the baseline's for the same triton release: more
    instructions, registers or spill bytes than ``threshold_pct`` allows is a regression."""
    base_figures = (entry.get("static") or {}).get(codegen_key(run))
    if not base_figures or record.outcome != "passed":
        return []
    out = []
    for name in STATIC_METRICS:
        base, cur = to_float(base_figures.get(name)), to_float(record.metrics.get(name))
        if base is None or cur is None:
            continue
        if base == 0:
            kind = "static grew" if cur > 0 else None
            change, note = None, "was 0"
        else:
            change = (cur / base - 1.0) * 100.0
            kind = "static grew" if change > threshold_pct else "static shrank" if change < -threshold_pct else None
            note = "machine code, same triton release"
        if kind:
            out.append(_finding(kind, key, run, record, name, base, cur, change, note))
    return out


def compare(
    results: ResultSet,
    baseline: dict,
    *,
    source: str = "baseline",
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    error_factor: float = DEFAULT_ERROR_FACTOR,
) -> Comparison:
    """Flag slowdowns over ``threshold_pct``, lost timings, new failures and grown errors against ``baseline``."""
    cases = baseline.get("cases", {})
    comparison = Comparison(
        source=clean_text(source),
        created=baseline.get("created"),
        threshold_pct=threshold_pct,
        error_factor=error_factor,
        environments=list((baseline.get("source") or {}).get("environments") or []),
    )
    seen: set[str] = set()
    new: set[str] = set()
    baseline_envs = {entry.get("env") for entry in cases.values()}
    for run in results.runs:
        if run.records and run.environment_key not in baseline_envs:
            comparison.not_comparable.append(run.label)
        for record in run.records:
            key = case_key(record)
            entry = cases.get(key)
            if entry is None:
                new.add(key)
                continue
            seen.add(key)
            comparison.compared += 1
            if entry.get("outcome") == "passed" and record.outcome in BAD_OUTCOMES:
                comparison.regressions.append(
                    _finding("new failure", key, run, record, "outcome", "passed", record.outcome)
                )
                continue
            for finding in _static_findings(key, run, record, entry, threshold_pct):
                (comparison.regressions if finding.kind == "static grew" else comparison.improvements).append(finding)
            if record.outcome != "passed" or entry.get("env") != run.environment_key:
                continue
            timing = _timing_finding(key, run, record, entry, threshold_pct)
            errors = _error_findings(key, run, record, entry, error_factor)
            if is_reference(record):
                comparison.references.extend(f for f in (timing, *errors) if f is not None)
                continue
            if timing is not None:
                (comparison.improvements if timing.kind == "faster" else comparison.regressions).append(timing)
            comparison.regressions.extend(errors)
    comparison.new_cases = sorted(new)
    comparison.missing_cases = sorted(set(cases) - seen)
    order = {"new failure": 0, "timing lost": 1, "slower": 2, "static grew": 3, "error grew": 4}
    comparison.regressions.sort(key=lambda f: (order[f.kind], -(f.change_pct or math.inf)))
    comparison.improvements.sort(key=lambda f: f.change_pct or 0.0)
    comparison.references.sort(key=lambda f: (f.change_pct is not None, -abs(f.change_pct or 0.0)))
    return comparison
