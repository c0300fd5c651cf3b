"""Performance goals that benchmark cases set themselves, and whether each was met.

A case states its goals beside its figures: ``record.add(goals={"speedup.sdpa_fp16": 4.0,
"pct_of_peak": 80.0})``, each the least value of a figure, named as a metric (``pct_of_peak``)
or as ``speedup.<baseline>``. The report lists every goal with the figure measured in the
same run. A goal is a figure to show, never an outcome: a missed goal fails no case and no run
(timings are no assertions), and a case that did not pass has no figure to meet it with.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import Record
from .fmt import fmt_sig, to_float
from .load import ResultSet
from .summary import suite_name


@dataclass(frozen=True)
class Goal:
    run_label: str
    suite: str
    case: str
    variant: str
    figure: str  # "pct_of_peak", "speedup.sdpa_fp16", ...
    least: float
    value: float | None  # None: the case did not pass, or recorded no such figure

    @property
    def met(self) -> bool:
        return self.value is not None and self.value >= self.least


def figure_of(metrics: dict, name: str) -> float | None:
    """The figure ``name`` of a record's metrics: a metric, or ``speedup.<baseline>``."""
    if name.startswith("speedup."):
        speedup = metrics.get("speedup")
        return to_float(speedup.get(name.split(".", 1)[1])) if isinstance(speedup, dict) else None
    return to_float(metrics.get(name))


def goals_of_record(run_label: str, record: Record) -> list[Goal]:
    """The goals one record states (none when its ``goals`` is no mapping of figures to numbers)."""
    stated = record.metrics.get("goals")
    if not isinstance(stated, dict):
        return []
    goals = []
    for figure, least in stated.items():
        bound = to_float(least)
        if bound is None:
            continue
        value = figure_of(record.metrics, str(figure)) if record.outcome == "passed" else None
        goals.append(Goal(run_label, suite_name(record), record.case, record.variant or "", str(figure), bound,
                          value))
    return goals


def goals_of(results: ResultSet) -> list[Goal]:
    """Every goal of every run, in the runs' order."""
    return [goal for run, record in results.pairs() for goal in goals_of_record(run.label, record)]


def describe(goal: Goal) -> str:
    """``bench_decode::case [variant] speedup.sdpa_fp16 3.40 (goal >= 4) on leg``."""
    value = "no figure" if goal.value is None else fmt_sig(goal.value)
    variant = f" [{goal.variant}]" if goal.variant else ""
    return (f"{goal.suite}::{goal.case}{variant} {goal.figure} {value} (goal >= {fmt_sig(goal.least)}) "
            f"on {goal.run_label}")


def goals_line(goals: list[Goal]) -> str:
    """``goals: 2 of 8 met`` (empty when no case states one)."""
    if not goals:
        return ""
    return f"goals: {sum(g.met for g in goals)} of {len(goals)} met"
