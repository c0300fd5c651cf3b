"""Reading result sets: run directories (``records.jsonl`` + ``manifest.json``) or records files.

Every input becomes one or more :class:`Run` objects (one per version leg found in
it). Runs of the same leg on the same machine by the same session (the suites and the
benchmarks of one pipeline, say) merge into one :class:`Run`, one column of the report;
the session is the pipeline kind that names a run directory (``gpu_verify-<leg>-bench``),
so a ``bench`` run of the leg stays a column of its own. A confirmation re-run (a run directory
named ``<run>-confirm``, harness/run/pipeline.py) is no column: it is kept apart in
``ResultSet.confirmations``, which only the baseline comparison reads. Nothing here raises on bad input:
missing paths, unreadable lines and missing or incomplete manifests become ``problems``
that the report shows.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..records import (
    CONFIRM_SUFFIX,
    MANIFEST_FILE,
    RECORDS_FILE,
    Record,
    read_manifest,
    read_records,
)
from ..run.commands import KINDS
from .fmt import to_float

BAD_OUTCOMES = ("failed", "error", "crashed", "timeout")


@dataclass
class Run:
    """The records of one version leg on one machine, from one or more run directories."""

    source: Path
    leg: str
    manifest: dict
    records: list[Record]
    problems: list[str] = field(default_factory=list)
    label: str = ""  # unique column label, set by :func:`load_results`
    session: str = ""  # the pipeline kind that wrote it (:func:`session_of`), "" for other runs
    parts: list[tuple[Path, dict]] = field(default_factory=list)  # (source, manifest) merged here

    def __post_init__(self) -> None:
        if not self.parts:
            self.parts = [(self.source, self.manifest)]

    @property
    def env(self) -> dict:
        return self.manifest.get("env") or {}

    @property
    def has_manifest(self) -> bool:
        return bool(self.manifest)

    @property
    def complete(self) -> bool:
        """True only when every merged run has a manifest that says it finished."""
        return all(manifest.get("complete") is True for _, manifest in self.parts)

    @property
    def merge_key(self) -> tuple:
        return self.session, self.leg, self.host, self.mode, self.gpu

    def absorb(self, other: Run) -> None:
        """Take in the records of another run of the same leg on the same machine."""
        self.records.extend(other.records)
        self.problems.extend(other.problems)
        self.parts.extend(other.parts)
        if not self.manifest:
            self.manifest = other.manifest

    def manifest_values(self, key: str) -> list:
        """``key`` from the manifest of every merged run (None where absent)."""
        return [manifest.get(key) for _, manifest in self.parts]

    @property
    def mode(self) -> str:
        mode = self.manifest.get("mode") or self.env.get("mode")
        if mode:
            return str(mode)
        devices = {str(r.device or "") for r in self.records}
        if any(d.startswith("cuda") for d in devices):
            return "gpu"
        return "unknown"

    @property
    def host(self) -> str:
        return str(self.env.get("host") or "unknown host")

    @property
    def gpu(self) -> str | None:
        gpu = self.env.get("gpu")
        return str(gpu) if gpu else None

    @property
    def environment_key(self) -> str:
        """What timings are comparable across: mode and GPU model (``gpu/NVIDIA H200``)."""
        return f"{self.mode}/{self.gpu or 'cpu'}"

    def counts(self) -> Counter:
        return Counter(r.outcome for r in self.records)


@dataclass
class ResultSet:
    runs: list[Run]
    problems: list[str] = field(default_factory=list)  # problems not tied to one run
    confirmations: list[Run] = field(default_factory=list)  # re-runs of suspected slowdowns

    def pairs(self):
        """Every (run, record) pair in input order."""
        for run in self.runs:
            for record in run.records:
                yield run, record

    @property
    def n_records(self) -> int:
        return sum(len(run.records) for run in self.runs)

    def all_problems(self) -> list[tuple[str, str]]:
        """(where, problem) pairs: global ones first, then each run's."""
        out = [("input", p) for p in self.problems]
        for run in self.runs:
            out.extend((run.label, p) for p in run.problems)
        return out


def _find_run_dirs(root: Path) -> list[Path]:
    found = {p.parent for name in (RECORDS_FILE, MANIFEST_FILE) for p in root.rglob(name)}
    return sorted(found)


def session_of(run_dir: Path | None) -> str:
    """The pipeline kind of a run directory named ``<kind>-<leg>[-bench]``, else ""."""
    kind = run_dir.name.split("-", 1)[0] if run_dir is not None else ""
    return kind if kind in KINDS else ""


def _load_one(records_path: Path, run_dir: Path | None, source: Path) -> list[Run]:
    manifest = read_manifest(run_dir) if run_dir is not None else {}
    problems: list[str] = []
    if records_path.exists():
        result = read_records(records_path)
        records, problems = result.records, list(result.problems)
    else:
        records = []
        problems.append(f"{records_path.name} missing: no case was recorded")
    if not manifest:
        problems.append(f"{MANIFEST_FILE} missing or unreadable: run treated as incomplete")
    elif manifest.get("complete") is not True:
        status = manifest.get("exitstatus")
        why = f" (exit status {status})" if status is not None else " (no end-of-run entry)"
        problems.append(f"incomplete run: manifest says the run did not finish{why}")
    problems = [f"{source}: {problem}" for problem in problems]

    manifest_leg = str(manifest.get("leg") or (manifest.get("env") or {}).get("leg") or "")
    by_leg: dict[str, list[Record]] = {}
    for record in records:
        by_leg.setdefault(record.leg or manifest_leg or "unnamed leg", []).append(record)
    if not by_leg:
        by_leg[manifest_leg or "unnamed leg"] = []
    runs = []
    for leg, leg_records in by_leg.items():
        # The manifest describes the leg it names; records of other legs in the same
        # file keep only their records (a concatenated file, for example).
        owns = len(by_leg) == 1 or leg == manifest_leg
        runs.append(
            Run(
                source=source,
                leg=leg,
                manifest=manifest if owns else {},
                records=leg_records,
                problems=list(problems) if owns else [f"records of leg {leg!r} without a manifest"],
                session=session_of(run_dir),
            )
        )
    return runs


def _label_runs(runs: list[Run]) -> None:
    legs = Counter(run.leg for run in runs)
    used: set[str] = set()
    for run in runs:
        label = run.leg
        if legs[run.leg] > 1:
            hosts = {r.host for r in runs if r.leg == run.leg}
            label = f"{run.leg} @ {run.host}" if len(hosts) > 1 else f"{run.leg} [{run.source.name}]"
        base, n = label, 2
        while label in used:
            label, n = f"{base} #{n}", n + 1
        used.add(label)
        run.label = label


def is_confirmation(run: Run) -> bool:
    """Whether ``run`` is a confirmation re-run: read from a directory named ``...-confirm``."""
    folder = run.source.parent if run.source.is_file() else run.source
    return folder.name.endswith(CONFIRM_SUFFIX)


def _merged(runs: list[Run]) -> list[Run]:
    """Runs of the same session, leg and machine merged into one."""
    merged: dict[tuple, Run] = {}
    for run in runs:
        if run.merge_key in merged:
            merged[run.merge_key].absorb(run)
        else:
            merged[run.merge_key] = run
    return list(merged.values())


def load_results(paths: list[str | os.PathLike]) -> ResultSet:
    """Load run directories, records files, or folders holding several run directories."""
    runs: list[Run] = []
    problems: list[str] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        if path.is_file() and path.name == MANIFEST_FILE:
            runs.extend(_load_one(path.parent / RECORDS_FILE, path.parent, path.parent))
        elif path.is_file():
            run_dir = path.parent if (path.parent / MANIFEST_FILE).exists() else None
            runs.extend(_load_one(path, run_dir, path))
        elif path.is_dir():
            if (path / RECORDS_FILE).exists() or (path / MANIFEST_FILE).exists():
                run_dirs = [path]
            else:
                run_dirs = _find_run_dirs(path)
            if not run_dirs:
                problems.append(f"{path}: no {RECORDS_FILE} or {MANIFEST_FILE} found")
            for run_dir in run_dirs:
                runs.extend(_load_one(run_dir / RECORDS_FILE, run_dir, run_dir))
        else:
            problems.append(f"{path}: no such file or directory")
    reruns = [run for run in runs if is_confirmation(run)]
    if len(reruns) == len(runs):  # a re-run given alone is shown: it is all the results there are
        reruns = []
    runs = _merged([run for run in runs if all(run is not rerun for rerun in reruns)])
    confirmations = _merged(reruns)
    _label_runs(runs)
    for run in confirmations:
        run.label = f"{run.leg} (re-run)"
    return ResultSet(runs, problems, confirmations)


def _finite(value, default=None):
    number = to_float(value)
    return number if number is not None and math.isfinite(number) else default


def read_steps(path: str | os.PathLike) -> dict | None:
    """A pipeline's steps file (``<kind>-steps.json``: kind, leg, wall_s, gpus, steps), or None when
    it is missing or unreadable; odd fields are dropped or defaulted, so the report is then
    rendered without them, never refused."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        return None
    steps = []
    for step in data["steps"]:
        if not isinstance(step, dict) or "step" not in step:
            continue
        rc = _finite(step.get("rc"))
        steps.append({"step": str(step["step"]), "rc": None if rc is None else int(rc), "ok": step.get("ok") is True,
                      "seconds": _finite(step.get("seconds"), 0.0)})
    gpus = data.get("gpus")
    return {"kind": str(data.get("kind", "?")), "leg": str(data.get("leg") or ""),
            "wall_s": _finite(data.get("wall_s"), 0.0),
            "gpus": [str(g) for g in gpus] if isinstance(gpus, list) else [], "steps": steps}
