"""The A/B section's figures: the ``ab.json`` of ``python -m harness ab`` (harness/run/ab.py),
named on the command line or found beside the run directories the report renders."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..run import ab_results


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def find_ab(results: Sequence[str]) -> Path | None:
    """An ``ab.json`` in the folder of a rendered run directory or the one above it (the reports
    directory of ``<reports>/runs/<run>``) that names one of the rendered runs: an A/B file of
    other runs is left out, so an old one never lands in an unrelated report."""
    inputs = [Path(raw).resolve() for raw in results]
    seen: set[Path] = set()
    for path in inputs:
        for folder in (path, path.parent, path.parent.parent):
            candidate = folder / ab_results.AB_FILE
            if candidate in seen or not candidate.is_file():
                continue
            seen.add(candidate)
            try:
                ab = ab_results.read(candidate)
            except ValueError:
                continue
            if any(_within(run_dir.resolve(), inputs) for run_dir in ab_results.run_dirs_of(ab, folder)):
                return candidate
    return None


def ab_for_report(results: Sequence[str], explicit: str | None = None) -> dict | None:
    """The A/B figures to show: ``explicit`` (``--ab PATH``) or the file :func:`find_ab` finds;
    None when there is none. An unreadable file is said on stderr, never fatal."""
    path = Path(explicit) if explicit else find_ab(results)
    if path is None:
        return None
    try:
        ab = ab_results.read(path)
    except ValueError as exc:
        print(f"A/B section left out: {exc}", file=sys.stderr)
        return None
    ab["source"] = path.name
    return ab
