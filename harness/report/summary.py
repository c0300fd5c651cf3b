"""Aggregation: outcome counts, the suites x legs matrix, per-suite figures and the verdict.

Everything the page, the text summary and the Markdown summary show is computed
here once, from a :class:`~harness.report.load.ResultSet` and an optional baseline
:class:`~harness.report.baseline.Comparison`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field

from ..records import OUTCOMES, Record
from .fmt import to_float
from .load import BAD_OUTCOMES, ResultSet, Run

ERROR_METRICS = ("max_abs_err", "max_rel_err")
CHECKED_METRICS = ("states_checked", "elements_checked")


def suite_name(record: Record) -> str:
    """``group/suite`` (``suites/affine``), or the bare suite name when there is no group."""
    return f"{record.group}/{record.suite}" if record.group else record.suite


def worst(values) -> float | None:
    """Largest value, NaN counting as worst of all; None when there is none."""
    numbers = [v for v in (to_float(x) for x in values) if v is not None]
    if not numbers:
        return None
    if any(math.isnan(v) for v in numbers):
        return math.nan
    return max(numbers)


def checked_of(record: Record) -> float | None:
    for name in CHECKED_METRICS:
        value = to_float(record.metrics.get(name))
        if value is not None:
            return value
    return None


def tolerance_ratio(record: Record) -> float | None:
    """How near a case's error came to what it accepts (1: at its limit): ``err_to_tol`` when the
    case recorded it (a bound per element), else ``max_abs_err / tolerance``; None without either."""
    ratio = to_float(record.metrics.get("err_to_tol"))
    if ratio is not None:
        return ratio
    err, tol = to_float(record.metrics.get("max_abs_err")), to_float(record.metrics.get("tolerance"))
    if err is None or tol is None or not tol > 0:
        return None
    return err / tol


def impl_of(record: Record) -> str:
    """``backend/variant`` of a case, either part left out when empty."""
    return "/".join(p for p in (record.backend, record.variant) if p)


def is_reference(record: Record) -> bool:
    """A baseline timed beside the kernels (the record's metrics say ``"reference": true``)."""
    return record.metrics.get("reference") is True


@dataclass
class Stats:
    """Figures over a set of records (one cell, one suite, one leg or everything): outcomes and
    times of all of them; states checked, bit errors and worst errors of the kernels' own cases
    (a baseline timed beside them, such as torch.compile, is no check of the kernels)."""

    counts: Counter = field(default_factory=Counter)
    checked: float | None = None
    bit_errors: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_to_tol: float | None = None  # the largest :func:`tolerance_ratio`
    duration_s: float = 0.0

    @classmethod
    def of(cls, records: list[Record]) -> Stats:
        own = [r for r in records if not is_reference(r)]
        checked = [c for c in (checked_of(r) for r in own) if c is not None]
        bits = [b for b in (to_float(r.metrics.get("bit_errors")) for r in own) if b is not None]
        return cls(
            counts=Counter(r.outcome for r in records),
            checked=sum(checked) if checked else None,
            bit_errors=sum(bits) if bits else None,
            max_abs_err=worst(r.metrics.get("max_abs_err") for r in own),
            max_rel_err=worst(r.metrics.get("max_rel_err") for r in own),
            worst_to_tol=worst(tolerance_ratio(r) for r in own),
            duration_s=sum(float(r.duration_s or 0.0) for r in records),
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def bad(self) -> int:
        return sum(self.counts[o] for o in BAD_OUTCOMES)

    @property
    def status(self) -> str:
        """``bad`` (something failed), ``ok`` (something passed, nothing failed), ``skip``, ``none``."""
        if self.bad:
            return "bad"
        if self.counts["passed"]:
            return "ok"
        return "skip" if self.total else "none"

    def cell_text(self) -> str:
        if not self.total:
            return "\N{EM DASH}"
        ran = self.total - self.counts["skipped"]
        if not ran:
            return f"{self.counts['skipped']} skipped"
        return f"{self.counts['passed']}/{ran}"


@dataclass
class Cell:
    run: Run
    records: list[Record]
    stats: Stats
    anchor: str

    @property
    def title(self) -> str:
        parts = [f"{n} {o}" for o in OUTCOMES if (n := self.stats.counts[o])]
        return ", ".join(parts) or "no cases"


@dataclass
class CaseRow:
    """One case of a suite over the legs that ran it: ``legs`` holds, per leg of the suite's table
    (:attr:`Suite.present`), the case's records there (empty where that leg did not run it)."""

    case: str
    legs: list[list[Record]]

    @property
    def records(self) -> list[Record]:
        return [r for records in self.legs for r in records]

    @property
    def bad(self) -> bool:
        return any(r.outcome in BAD_OUTCOMES for r in self.records)

    @property
    def impl(self) -> str:
        """The distinct ``backend/variant`` of the case's records, joined with ``, ``."""
        return ", ".join(dict.fromkeys(filter(None, map(impl_of, self.records))))


@dataclass
class Suite:
    name: str
    anchor: str
    cells: list[Cell | None]  # one per run, None when the run has no case of this suite
    stats: Stats

    @property
    def present(self) -> list[Cell]:
        return [c for c in self.cells if c is not None]

    def case_rows(self) -> list[CaseRow]:
        """One row per case id over the legs that ran the suite: rows with a case that did not
        pass first, then in the order the cases were first recorded."""
        present = self.present
        rows: dict[str, CaseRow] = {}
        for index, cell in enumerate(present):
            for record in cell.records:
                row = rows.setdefault(record.case, CaseRow(record.case, [[] for _ in present]))
                row.legs[index].append(record)
        return sorted(rows.values(), key=lambda row: not row.bad)


# What the error-to-tolerance ratio measures against, said wherever the headline ratio is shown:
# a round trip's worst error sits just under its bound by construction, and 0.999x reads as a warning.
TOLERANCE_NOTE = ("a case's tolerance is the bound its own check asserts; for a quantization round trip that is "
                  "half a quantization step, which the rounding error approaches over many elements, so a ratio "
                  "near 1 is expected there; above 1 fails the case")


@dataclass
class ToleranceFigure:
    """The case whose error came nearest its tolerance (or went furthest past it)."""

    ratio: float
    run: Run
    record: Record
    rated: int  # how many cases carry a tolerance

    @property
    def where(self) -> str:
        """``suite::case [backend/variant] on leg``."""
        impl = impl_of(self.record)
        return (f"{suite_name(self.record)}::{self.record.case}{f' [{impl}]' if impl else ''} "
                f"on {self.run.label}")


@dataclass
class BadInput:
    suite: str
    case: str
    backend: str | None
    error_type: str
    error_message: str
    outcomes: dict[str, str] = field(default_factory=dict)  # leg label -> outcome

    @property
    def bad(self) -> bool:
        return any(o in BAD_OUTCOMES for o in self.outcomes.values())


def _instant(text) -> dt.datetime | None:
    """An ISO-8601 time as an aware datetime (UTC when it names no zone), None when unreadable."""
    try:
        moment = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _nan_largest(item: tuple) -> float:
    return math.inf if math.isnan(item[0]) else item[0]


def _bad_inputs_of(r: Record) -> list[tuple[str, str, str]]:
    """(case, error type, message) for each bad input a record tried: the single
    ``error_type``/``error_message`` pair, and every entry of ``bad_inputs``."""
    found = []
    if "error_type" in r.metrics or "error_message" in r.metrics:
        found.append((r.case, str(r.metrics.get("error_type", "")), str(r.metrics.get("error_message", ""))))
    entries = r.metrics.get("bad_inputs")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict):
            label = f"{r.case}: {entry['input']}" if entry.get("input") else r.case
            found.append((label, str(entry.get("error_type", "")), str(entry.get("error_message", ""))))
    return found


@dataclass
class Summary:
    results: ResultSet
    suites: list[Suite]
    stats: Stats
    run_stats: list[Stats]
    comparison: object | None = None  # baseline.Comparison
    pipeline: dict | None = None  # the pipeline's steps file: kind, wall_s, steps [{step, rc, ok, seconds}]
    ab: dict | None = None  # a same-job A/B's figures (harness/report/ab.py)

    @property
    def runs(self) -> list[Run]:
        return self.results.runs

    @property
    def counts(self) -> Counter:
        return self.stats.counts

    @property
    def incomplete(self) -> list[Run]:
        return [run for run in self.runs if not run.complete]

    @property
    def modes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for run in self.runs:
            out.setdefault(run.mode, []).append(run.label)
        return out

    @property
    def where(self) -> list[str]:
        """Distinct machines: ``host (GPU)`` or ``host (CPU, interpreter)``."""
        seen: list[str] = []
        for run in self.runs:
            text = f"{run.host} ({run.gpu or 'CPU'}, {run.mode})"
            if text not in seen:
                seen.append(text)
        return seen

    @property
    def n_regressions(self) -> int:
        return len(self.comparison.regressions) if self.comparison is not None else 0

    @property
    def n_problems(self) -> int:
        return len(self.results.all_problems())

    @property
    def verdict(self) -> str:
        """FAILED before INCOMPLETE: a run that did not finish, or an input not read whole (a
        record lost to an unreadable line may be a failure), is never PASSED."""
        if not self.stats.total:
            return "NO RESULTS"
        if self.stats.bad:
            return "FAILED"
        if self.incomplete or self.n_problems:
            return "INCOMPLETE"
        if self.n_regressions:
            return "REGRESSED"
        if not self.counts["passed"]:
            return "ALL SKIPPED"
        return "PASSED"

    @property
    def verdict_class(self) -> str:
        return {"PASSED": "ok", "FAILED": "bad", "REGRESSED": "warn", "INCOMPLETE": "warn"}.get(
            self.verdict, "none"
        )

    def closest_to_tolerance(self) -> ToleranceFigure | None:
        """The kernels' case with the largest error-to-tolerance ratio (NaN counting as largest);
        None when no case carries a tolerance."""
        rated = [(tolerance_ratio(r), run, r) for run, r in self.results.pairs() if not is_reference(r)]
        rated = [item for item in rated if item[0] is not None]
        if not rated:
            return None
        ratio, run, record = max(rated, key=_nan_largest)
        return ToleranceFigure(ratio, run, record, len(rated))

    @property
    def wall_s(self) -> float | None:
        """The whole run's wall time: from the first start to the last end over every run directory
        read (the legs of a family run one after another); an unfinished run ends at its last
        record. None when no start or end is known."""
        starts, ends = [], []
        for run in self.runs:
            for _, manifest in run.parts:
                starts.append(_instant(manifest.get("started")))
                ends.append(_instant(manifest.get("finished")))
            ends.extend(_instant(r.time) for r in run.records)
        starts = [t for t in starts if t is not None]
        ends = [t for t in ends if t is not None]
        if not starts or not ends:
            return None
        return max(0.0, (max(ends) - min(starts)).total_seconds())

    def failing(self) -> list[tuple[Run, Record]]:
        return [(run, r) for run, r in self.results.pairs() if r.outcome in BAD_OUTCOMES]

    def bad_input(self) -> list[BadInput]:
        """What each bad-input case raised, merged over legs (one row per distinct error)."""
        rows: dict[tuple, BadInput] = {}
        for run, r in self.results.pairs():
            for case, etype, message in _bad_inputs_of(r):
                key = (suite_name(r), case, r.backend, etype, message)
                row = rows.setdefault(key, BadInput(suite_name(r), case, r.backend, etype, message))
                row.outcomes[run.label] = r.outcome
        return list(rows.values())

    def copy_ceiling(self, run: Run) -> float | None:
        """The copy bandwidth measured in this run (GB/s), from records that carry it."""
        return worst(r.metrics.get("copy_gbps") for r in run.records)


def summarize(results: ResultSet, comparison=None) -> Summary:
    names: list[str] = []
    by_suite: dict[str, list[list[Record]]] = {}
    for index, run in enumerate(results.runs):
        for record in run.records:
            name = suite_name(record)
            if name not in by_suite:
                names.append(name)
                by_suite[name] = [[] for _ in results.runs]
            by_suite[name][index].append(record)
    # Suites under suites/ first, then the harness's own tests, each alphabetical.
    names.sort(key=lambda n: (not n.startswith("suites/"), n))
    suites = []
    for s_index, name in enumerate(names):
        cells: list[Cell | None] = []
        for r_index, run in enumerate(results.runs):
            records = by_suite[name][r_index]
            cells.append(
                Cell(run, records, Stats.of(records), f"c{s_index}-{r_index}") if records else None
            )
        flat = [r for recs in by_suite[name] for r in recs]
        suites.append(Suite(name, f"s{s_index}", cells, Stats.of(flat)))
    everything = [r for _, r in results.pairs()]
    return Summary(
        results=results,
        suites=suites,
        stats=Stats.of(everything),
        run_stats=[Stats.of(run.records) for run in results.runs],
        comparison=comparison,
    )
