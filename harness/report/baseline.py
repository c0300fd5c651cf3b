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
          "ms_n": int, "ms_min": float, "ms_iqr": float, "ms_mad": float,  # the spread (optional)
          "spread": "repeats" | "runs",       # of one run's repeats, or across runs (history)
          "bound": "device" | "host" | "cpu", # what the figure was bound by (optional)
          "max_abs_err": float, "max_rel_err": float, "bit_errors": float,  # worst over legs
          "static": {"triton X.Y.Z": {"instructions_per_element": float, "registers": int, ...}}
        }, ...
      }
    }

A baseline written by ``harness.history.rolling_baseline`` has the same form: each case's
median over the last runs of one leg and GPU, its spread across those runs.

**Noise.** A timing changed when it moved by more than ``threshold_pct`` *and* by more than its
noise: ``|now - baseline| > NOISE_K * sqrt(sigma_baseline**2 + sigma_now**2)``, each sigma the
figure's robust standard deviation (1.4826 * ``ms_mad``, else ``ms_iqr`` / 1.349) and never less
than NOISE_FLOOR_PCT of its median, which is all a figure without a recorded spread (an older
baseline, a bandwidth) has. With both sigmas at the floor a change must pass about 9% (3 * 2% *
sqrt(1 + 1.1**2) at +10%), so the 10% threshold decides alone for figures without a spread, as
before the spread was kept.

**Categories.** A slowdown of a kernel's own figure beyond threshold and noise is a suspected
regression; where the pipeline re-ran the suspected cases (``ResultSet.confirmations``) it stays
a regression only when the re-run is slower again beyond threshold and noise (``confirmed``),
else it is listed as unconfirmed. An error grown past ``error_factor`` times the baseline's is
weighed the same way: the re-run draws fresh random inputs, and the error stays a regression
only when it is past the factor again. Slowdowns within the noise, figures bound by the host's launch
cost (``bound: "host"``) and CPU baselines (a case on the CPU in a GPU run) are listed apart and
never count as regressions on their timing; a record whose metrics say ``"reference": true`` is
a reference measurement, a baseline a benchmark times beside the kernels (torch.compile, the
INT8 C++ CPU baseline): its timing and error changes are listed as references moved, not as
regressions of the kernels (a new failure still is one, and so is a grown error of any case).

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

from ..measure.noise import median_se, spread_sigma
from ..records import (
    BASELINE_FORMAT,
    BASELINE_THRESHOLD_PCT,
    OUTCOME_SEVERITY,
    OUTCOMES,
    Record,
    utc_now,
    write_json_atomic,
)
from .fmt import clean_text, fmt_sig, fmt_signed_pct, to_float
from .load import BAD_OUTCOMES, ResultSet, Run
from .summary import ERROR_METRICS, is_reference, suite_name, worst

FORMAT = BASELINE_FORMAT
VERSION = 1
DEFAULT_THRESHOLD_PCT = BASELINE_THRESHOLD_PCT
DEFAULT_ERROR_FACTOR = 2.0
TIMING_METRICS = ("ms", "gbps", "pct_of_peak")
SPREAD_METRICS = ("ms_n", "ms_min", "ms_iqr", "ms_mad")  # the repeats' spread around ms
NOISE_K = 3.0  # a change must exceed this many combined robust standard deviations
NOISE_FLOOR_PCT = 2.0  # the least noise a figure is taken to have, in % of its median
# What a timed case is, for the comparison of its timing (timing_category).
KERNEL, HOST_BOUND, CPU_BASELINE, REFERENCE = "kernel", "host-bound", "cpu baseline", "reference"
# Figures of a kernel's machine code (suites/test_sass_budget.py): the same on every machine for
# one triton release, so compared per triton release in any environment, where timings are not.
STATIC_METRICS = ("instructions_per_element", "loop_instructions", "registers", "stack_bytes")
# Outcomes from least to most severe: a key's baseline outcome is its worst.
_SEVERITY = {o: i for i, o in enumerate(OUTCOME_SEVERITY)}
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
    entry.update(_spread_entry(passed))
    for name in (*ERROR_METRICS, "bit_errors"):
        value = worst(r.metrics.get(name) for r in passed)
        if value is not None:
            entry[name] = value if math.isfinite(value) else str(value)
    return entry


def _spread_entry(passed: list[Record]) -> dict:
    """The repeats' spread of a case (medians over its records) and the most common ``bound``."""
    out: dict = {}
    for name in SPREAD_METRICS:
        value = _median(r.metrics.get(name) for r in passed)
        if value is not None:
            out[name] = value
    if out:
        out["spread"] = "repeats"
    bounds = Counter(r.metrics.get("bound") for r in passed if isinstance(r.metrics.get("bound"), str))
    if bounds:
        out["bound"] = bounds.most_common(1)[0][0]
    return out


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
    nodeid: str = ""
    category: str = KERNEL  # of a timing: KERNEL, HOST_BOUND, CPU_BASELINE or REFERENCE
    noise_pct: float | None = None  # of a timing: the change its noise accounts for, in %
    confirmed: bool | None = None  # of a suspected slowdown: what its re-run said; None: not re-run

    @property
    def stands_out(self) -> bool:
        """Whether a timing moved by more than its noise (no noise known: it did)."""
        return self.noise_pct is None or self.change_pct is None or abs(self.change_pct) > self.noise_pct


@dataclass
class Comparison:
    """What changed against a baseline. Only ``regressions`` count for the verdict; the other
    lists are shown apart: ``unconfirmed`` (suspected kernel slowdowns their re-run did not
    repeat), ``within_noise`` (kernel slowdowns over the threshold but inside the noise),
    ``host_bound`` and ``cpu_baselines`` (timings of host-bound calls and of CPU baselines on a
    GPU host), ``references`` (reference measurements that moved)."""

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
    unconfirmed: list[Finding] = field(default_factory=list)
    within_noise: list[Finding] = field(default_factory=list)
    host_bound: list[Finding] = field(default_factory=list)
    cpu_baselines: list[Finding] = field(default_factory=list)
    noise_k: float = NOISE_K
    noise_floor_pct: float = NOISE_FLOOR_PCT
    reruns: list[str] = field(default_factory=list)  # labels of the confirmation re-runs weighed
    # per GPU model the baseline file was not measured on: what its history in the run history had to say
    history_notes: list[str] = field(default_factory=list)

    def kinds(self) -> Counter:
        return Counter(f.kind for f in self.regressions)

    @property
    def confirmed(self) -> list[Finding]:
        """Slowdowns a confirmation re-run repeated."""
        return [f for f in self.regressions if f.confirmed]

    def suspects(self) -> list[Finding]:
        """Kernel slowdowns beyond threshold and noise, and errors grown past the factor, that no
        re-run has weighed yet."""
        return [f for f in self.regressions if f.confirmed is None
                and ((f.kind == "slower" and f.category == KERNEL) or f.kind == "error grew")]


def _finding(kind, key, run, record, metric, base, cur, change=None, note="") -> Finding:
    return Finding(kind, key, run.label, suite_name(record), record.case, record.backend,
                   record.variant, metric, base, cur, change, note, nodeid=record.nodeid)


def _timing(value) -> float | None:
    """A time or bandwidth that can be compared: finite and positive; else None."""
    number = to_float(value)
    return number if number is not None and math.isfinite(number) and number > 0 else None


def _nonnegative(value) -> float | None:
    number = to_float(value)
    return number if number is not None and math.isfinite(number) and number >= 0 else None


def robust_sigma(figures: dict, median: float, floor_pct: float = NOISE_FLOOR_PCT) -> float:
    """The noise of a median time as a standard deviation, never below ``floor_pct`` of ``median``
    (all a figure without a spread has). From its repeats (``ms_mad``, else ``ms_iqr``, as a
    sigma): the standard error of their median (harness.measure.noise.median_se), since the figure
    compared is the median, not one repeat. From a rolling baseline (``spread: "runs"``): the
    spread of the runs' medians itself, which is how far the next run's median may fall."""
    spread = spread_sigma(_nonnegative(figures.get("ms_mad")), _nonnegative(figures.get("ms_iqr"))) or 0.0
    repeats = _nonnegative(figures.get("ms_n"))
    if figures.get("spread") != "runs" and repeats and repeats >= 1:
        spread = median_se(spread, repeats)
    return max(spread, floor_pct / 100.0 * median)


def noise_pct(base: float, cur: float, base_sigma: float, cur_sigma: float, k: float = NOISE_K) -> float:
    """The change, in % of ``base``, that k combined standard deviations of two figures account for."""
    return 100.0 * k * math.hypot(base_sigma, cur_sigma) / base


def timing_change(entry: dict, metrics: dict, *, k: float = NOISE_K,
                  floor_pct: float = NOISE_FLOOR_PCT) -> tuple[str, float, float, float, float] | None:
    """(metric, baseline, now, change %, noise %) of ms against the baseline's ms, else of GB/s
    against its GB/s (a drop in bandwidth as the slowdown in time it means); None when the two
    have no figure in common. The noise of a bandwidth is the floor (no spread is kept for it)."""
    base_ms, cur_ms = _timing(entry.get("ms")), _timing(metrics.get("ms"))
    if base_ms and cur_ms:
        noise = noise_pct(base_ms, cur_ms, robust_sigma(entry, base_ms, floor_pct),
                          robust_sigma(metrics, cur_ms, floor_pct), k)
        return "ms", base_ms, cur_ms, (cur_ms / base_ms - 1.0) * 100.0, noise
    base_bw, cur_bw = _timing(entry.get("gbps")), _timing(metrics.get("gbps"))
    if base_bw and cur_bw:
        noise = noise_pct(1.0, 1.0, floor_pct / 100.0, floor_pct / 100.0, k)
        return "gbps", base_bw, cur_bw, (base_bw / cur_bw - 1.0) * 100.0, noise
    return None


def _noise_note(change: float, noise: float) -> str:
    where = "beyond" if abs(change) > noise else "within"
    return f"{where} the noise (\N{PLUS-MINUS SIGN}{noise:.1f}%)"


def _timing_finding(key, run, record, entry, threshold_pct, k=NOISE_K, floor_pct=NOISE_FLOOR_PCT) -> Finding | None:
    """ms against the baseline's ms, else GB/s against its GB/s, over ``threshold_pct`` either way,
    with the noise of the two figures. A case whose baseline had a time or bandwidth but that now
    has neither (NaN, 0 or none recorded) has lost its timing."""
    change = timing_change(entry, record.metrics, k=k, floor_pct=floor_pct)
    if change is None:
        base_ms, base_bw = _timing(entry.get("ms")), _timing(entry.get("gbps"))
        if not (base_ms or base_bw):
            return None
        metric = "ms" if base_ms else "gbps"
        now = record.metrics.get(metric)
        note = "none recorded now" if now is None else "no finite positive figure now"
        return _finding("timing lost", key, run, record, metric, base_ms or base_bw, now, None, note)
    metric, base, cur, pct, noise = change
    if abs(pct) <= threshold_pct:
        return None
    finding = _finding("slower" if pct > 0 else "faster", key, run, record, metric, base, cur, pct,
                       _noise_note(pct, noise))
    finding.noise_pct = noise
    return finding


def timing_category(run: Run, record: Record, entry: dict | None = None) -> str:
    """What a timed case is: a reference measurement, a CPU baseline (a case on the CPU in a GPU
    run: the host's CPU, not the kernels, is what it times), a host-bound call (``bound: "host"``:
    its figure is the host's launch cost) or a kernel's own figure. A case the baseline
    (``entry``) found device-bound stays a kernel's figure even when it is host-bound now: a
    change that put host work (a read-back, say) into the call must not excuse its own slowdown."""
    if is_reference(record):
        return REFERENCE
    on_cpu = str(record.device or "").startswith("cpu") or record.metrics.get("bound") == "cpu"
    if run.mode == "gpu" and on_cpu:
        return CPU_BASELINE
    if record.metrics.get("bound") == "host" and (entry or {}).get("bound") != "device":
        return HOST_BOUND
    return KERNEL


def _grown(base: float, cur: float, factor: float) -> tuple[bool, str]:
    """Whether an error ``cur`` grew past ``factor`` times its baseline ``base``, and how to say so."""
    if math.isnan(cur):
        return True, "now NaN"
    if base == 0:
        return cur > 0, "was exact"
    return cur > base * factor, f"over {factor:g}x the baseline"


def _error_findings(key, run, record, entry, factor) -> list[Finding]:
    out = []
    for name in (*ERROR_METRICS, "bit_errors"):
        base, cur = to_float(entry.get(name)), to_float(record.metrics.get(name))
        if base is None or cur is None or math.isnan(base):
            continue
        grew, note = _grown(base, cur, factor)
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


def _reruns(results: ResultSet, run: Run) -> dict[str, Record] | None:
    """The confirmation re-run's records of ``run`` by case key (its leg and environment), or None
    when ``run`` has no re-run."""
    mine = [r for r in results.confirmations if r.leg == run.leg and r.environment_key == run.environment_key]
    if not mine:
        return None
    return {case_key(record): record for rerun in mine for record in rerun.records}


def _confirm(finding: Finding, again: Record | None, entry: dict, k: float, floor_pct: float) -> None:
    """Weigh a suspected slowdown against its re-run: confirmed when the re-run is slower again
    beyond the noise (a slowdown just past the threshold need not cross it twice), unconfirmed
    when it is not; left unsettled (a regression all the same) when the re-run has no figure."""
    change = (timing_change(entry, again.metrics, k=k, floor_pct=floor_pct)
              if again and again.outcome == "passed" else None)
    if change is None:
        finding.note += "; its re-run has no figure"
        return
    _, _, cur, pct, noise = change
    finding.confirmed = pct > noise
    verb = "repeated" if finding.confirmed else "not repeated"
    finding.note += f"; {verb} by its re-run ({fmt_signed_pct(pct)}, {fmt_sig(cur)} {finding.metric})"


def _confirm_error(finding: Finding, again: Record | None, entry: dict, factor: float) -> None:
    """Weigh a grown error against its re-run, which draws fresh random inputs (one draw's error
    can be an outlier; a loss of precision shows in every draw): confirmed when the re-run's error
    is past the factor too, unconfirmed when it is not; left unsettled (a regression all the
    same) when the re-run has no figure."""
    cur = to_float(again.metrics.get(finding.metric)) if again and again.outcome == "passed" else None
    if cur is None:
        finding.note += "; its re-run has no figure"
        return
    finding.confirmed, _ = _grown(to_float(entry.get(finding.metric)), cur, factor)
    verb = "repeated" if finding.confirmed else "not repeated"
    finding.note += f"; {verb} by its re-run ({fmt_sig(cur)})"


def _file_timing(comparison: Comparison, finding: Finding) -> None:
    """Put a timing finding in its list: only a kernel's slowdown beyond threshold and noise that
    its re-run did not contradict, and a lost timing of any case, is a regression."""
    if finding.kind == "timing lost":  # a case that stopped timing is broken, whatever bounds it
        comparison.regressions.append(finding)
    elif finding.category == CPU_BASELINE:
        comparison.cpu_baselines.append(finding)
    elif finding.category == HOST_BOUND:
        comparison.host_bound.append(finding)
    elif finding.kind == "faster":
        if finding.stands_out:
            comparison.improvements.append(finding)
    elif finding.kind == "slower" and not finding.stands_out:
        comparison.within_noise.append(finding)
    elif finding.confirmed is False:
        comparison.unconfirmed.append(finding)
    else:
        comparison.regressions.append(finding)


_ORDER = {"new failure": 0, "timing lost": 1, "slower": 2, "static grew": 3, "error grew": 4}


def _sort(comparison: Comparison) -> None:
    comparison.regressions.sort(key=lambda f: (_ORDER[f.kind], -(f.change_pct or math.inf)))
    comparison.improvements.sort(key=lambda f: f.change_pct or 0.0)
    comparison.references.sort(key=lambda f: (f.change_pct is not None, -abs(f.change_pct or 0.0)))
    for apart in (comparison.unconfirmed, comparison.within_noise, comparison.host_bound, comparison.cpu_baselines):
        apart.sort(key=lambda f: (f.change_pct is not None, -(f.change_pct or 0.0)))


def compare(
    results: ResultSet,
    baseline: dict,
    *,
    source: str = "baseline",
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    error_factor: float = DEFAULT_ERROR_FACTOR,
    noise_k: float = NOISE_K,
    noise_floor_pct: float = NOISE_FLOOR_PCT,
) -> Comparison:
    """Flag slowdowns over ``threshold_pct`` and the noise, lost timings, new failures and grown
    errors against ``baseline``; weigh suspected slowdowns against their re-runs and list the
    timings of host-bound calls, CPU baselines and reference measurements apart."""
    cases = baseline.get("cases", {})
    comparison = Comparison(
        source=clean_text(source),
        created=baseline.get("created"),
        threshold_pct=threshold_pct,
        error_factor=error_factor,
        environments=list((baseline.get("source") or {}).get("environments") or []),
        noise_k=noise_k,
        noise_floor_pct=noise_floor_pct,
    )
    seen: set[str] = set()
    new: set[str] = set()
    baseline_envs = {entry.get("env") for entry in cases.values()}
    for run in results.runs:
        if run.records and run.environment_key not in baseline_envs:
            comparison.not_comparable.append(run.label)
        reruns = _reruns(results, run)
        if reruns is not None:
            comparison.reruns.append(f"{run.label} (re-run)")
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
            timing = _timing_finding(key, run, record, entry, threshold_pct, noise_k, noise_floor_pct)
            errors = _error_findings(key, run, record, entry, error_factor)
            category = timing_category(run, record, entry)
            if category == REFERENCE:
                for finding in (timing, *errors):
                    if finding is not None:
                        finding.category = REFERENCE
                        comparison.references.append(finding)
                continue
            for finding in errors:
                if reruns is not None:
                    _confirm_error(finding, reruns.get(key), entry, error_factor)
                (comparison.unconfirmed if finding.confirmed is False else comparison.regressions).append(finding)
            if timing is None:
                continue
            timing.category = category
            if category == KERNEL and timing.kind == "slower" and timing.stands_out and reruns is not None:
                _confirm(timing, reruns.get(key), entry, noise_k, noise_floor_pct)
            _file_timing(comparison, timing)
    comparison.new_cases = sorted(new)
    comparison.missing_cases = sorted(set(cases) - seen)
    _sort(comparison)
    return comparison


def merge_comparisons(parts: list[Comparison], *, source: str, not_comparable: list[str] = ()) -> Comparison:
    """One comparison of several (at least one: each leg against its own baseline), made with the
    same options: every list joined, a case new or missing when it is so for any part;
    ``not_comparable``: runs no part compared."""
    first = parts[0]
    merged = Comparison(clean_text(source), None, first.threshold_pct, first.error_factor,
                        sorted({env for part in parts for env in part.environments}),
                        noise_k=first.noise_k, noise_floor_pct=first.noise_floor_pct)
    for part in parts:
        for name in ("regressions", "improvements", "references", "unconfirmed", "within_noise", "host_bound",
                     "cpu_baselines", "not_comparable", "reruns"):
            getattr(merged, name).extend(getattr(part, name))
        merged.compared += part.compared
    merged.new_cases = sorted({key for part in parts for key in part.new_cases})
    merged.missing_cases = sorted({key for part in parts for key in part.missing_cases})
    merged.not_comparable.extend(not_comparable)
    _sort(merged)
    return merged


ROLLING_SPEC = "history"  # --baseline history[:N]: the rolling baseline of the run history
DEFAULT_ROLLING_RUNS = 5
# Against the history, the noise of each case is measured across runs of the same GPU model, so
# the threshold and the floor under that noise can be lower than a baseline file's, which was
# timed once, perhaps on another machine (H200 visits differ by up to 10%; runs within one by 0.2-2.4%).
# The floor keeps the threshold deciding for runs that agree: NOISE_K * sqrt(2) * 0.7% = 2.97% < 3%.
ROLLING_THRESHOLD_PCT = 3.0
ROLLING_NOISE_FLOOR_PCT = 0.7


def rolling_runs(spec: str) -> int | None:
    """N of a ``history[:N]`` baseline spec (DEFAULT_ROLLING_RUNS for plain ``history``), None for
    anything else (a baseline file); ValueError for an N that is no positive integer."""
    name, _, count = spec.partition(":")
    if name != ROLLING_SPEC:
        return None
    if not count:
        return DEFAULT_ROLLING_RUNS
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"--baseline {spec}: expected history or history:N with N a positive integer")
    return int(count)


def compare_rolling(results: ResultSet, last: int, history_path, **options) -> Comparison:
    """Each GPU leg of ``results`` against the rolling baseline of its own last ``last`` complete
    runs on the same GPU model in the run history (harness.history.rolling_baseline), with
    ROLLING_THRESHOLD_PCT and ROLLING_NOISE_FLOOR_PCT unless ``options`` say otherwise; runs of
    other modes are not compared. HistoryError when the history cannot be read."""
    from .. import history

    options = {"threshold_pct": ROLLING_THRESHOLD_PCT, "noise_floor_pct": ROLLING_NOISE_FLOOR_PCT, **options}

    groups: dict[tuple[str, str], list[Run]] = {}
    for run in results.runs:
        if run.mode == "gpu" and run.gpu:
            groups.setdefault((run.leg, run.gpu), []).append(run)
    parts, counted = [], []
    for (leg, gpu), runs in groups.items():
        mine = {history.run_key(manifest, Path(source)) for run in runs for source, manifest in run.parts}
        base = history.rolling_baseline(leg, gpu, last=last, path=history_path, exclude=mine)
        subset = ResultSet(runs, confirmations=[r for r in results.confirmations if r.leg == leg])
        counted.append(f"{leg}: {len(base['source']['runs'])} runs read")
        parts.append(compare(subset, base, source=f"history of {leg}", **options))
    source = f"history, each case's last {last} runs ({'; '.join(counted) or 'no GPU leg'})"
    if not parts:  # nothing to look up: every run is not comparable
        return compare(results, {"cases": {}}, source=source, **options)
    others = [run.label for run in results.runs if run.records and not (run.mode == "gpu" and run.gpu)]
    return merge_comparisons(parts, source=source, not_comparable=others)


# A GPU model the committed baseline file was not measured on is compared with its own runs in the
# run history once each case has this many there: the spread of fewer per-run medians says little
# about the noise, and one run judged against one earlier run is a coin toss.
HISTORY_RUNS_NEEDED = 3


def _take_from_history(comparison: Comparison, part: Comparison, file_cases: dict) -> None:
    """Add to a comparison against a baseline file what ``part`` (runs the file could not time,
    against their history) found: its timing and error findings, and the new failures of cases
    the file does not judge already (it compares outcomes in every environment)."""
    for name in ("regressions", "improvements", "references", "unconfirmed", "within_noise", "host_bound",
                 "cpu_baselines", "reruns"):
        found = getattr(part, name)
        if name == "regressions":
            found = [f for f in found if not (f.kind == "new failure" and f.key in file_cases)]
        getattr(comparison, name).extend(found)
    comparison.environments = sorted({*comparison.environments, *part.environments})


def compare_beside_history(results: ResultSet, baseline: dict, history_path, *, source: str = "baseline",
                           last: int = DEFAULT_ROLLING_RUNS, needed: int = HISTORY_RUNS_NEEDED,
                           **options) -> Comparison:
    """``results`` against a committed baseline file, as :func:`compare`; and each GPU leg on a GPU
    model the file was not measured on against that model's rolling baseline in the run history
    (each case's last ``last`` complete runs of the leg on that model), with the history's threshold
    and noise floor unless ``options`` say otherwise, once the history holds ``needed`` runs of a
    case: the file stays the yardstick of the models it has. ``history_notes`` says, per such model,
    how many runs the history holds and how many it needs; a history that cannot be read is said
    there, and those runs' timings stay uncompared."""
    from .. import history

    comparison = compare(results, baseline, source=source, **options)
    file_cases = baseline.get("cases", {})
    measured = {entry.get("env") for entry in file_cases.values()}
    elsewhere: dict[tuple[str, str], list[Run]] = {}
    for run in results.runs:
        if run.records and run.mode == "gpu" and run.gpu and run.environment_key not in measured:
            elsewhere.setdefault((run.leg, run.gpu), []).append(run)
    rolling = {"threshold_pct": ROLLING_THRESHOLD_PCT, "noise_floor_pct": ROLLING_NOISE_FLOOR_PCT, **options}
    for (leg, gpu), runs in elsewhere.items():
        what = f"{gpu} ({leg}) has no committed baseline"
        mine = {history.run_key(manifest, Path(part)) for run in runs for part, manifest in run.parts}
        try:
            base = history.rolling_baseline(leg, gpu, last=last, path=history_path, exclude=mine)
        except history.HistoryMissing:
            base = {"cases": {}}
        except history.HistoryError as exc:
            comparison.history_notes.append(f"{what}, and the run history cannot be read ({exc}): timings not compared")
            continue
        held = max((entry.get("runs_n", 0) for entry in base["cases"].values()), default=0)
        what += f"; the run history holds {held} run(s) of it, {needed} needed"
        if held < needed:
            comparison.history_notes.append(f"{what}: timings not compared")
            continue
        base["cases"] = {key: entry for key, entry in base["cases"].items() if entry.get("runs_n", 0) >= needed}
        subset = ResultSet(runs, confirmations=[r for r in results.confirmations
                                                if r.leg == leg and r.environment_key == runs[0].environment_key])
        part = compare(subset, base, source=f"history of {leg} on {gpu}", **rolling)
        _take_from_history(comparison, part, file_cases)
        compared = {run.label for run in runs}
        comparison.not_comparable = [label for label in comparison.not_comparable if label not in compared]
        comparison.history_notes.append(f"{what}: timings compared with each case's last {last} runs there "
                                        f"(threshold {part.threshold_pct:g}%)")
    _sort(comparison)
    return comparison
