"""Mutation testing: planted kernel bugs that the suites must catch.

``python -m harness.checks.mutants [--only NAME...] [--list] [--ci] [--results-dir DIR] [--jobs N]``

Each entry of :data:`CATALOGUE` is one bug, written as an exact text substitution
(``original`` -> ``mutated``) in one source file. The entries are data, in
``harness/checks/mutant_catalogue.py``; this module is their runner. It copies the
project's working tree into a temporary directory per worker (the sources here are never
touched), applies one mutant at a time, runs the suites mapped to it there with
pytest (``-x -q -p no:cacheprovider`` and a per-mutant timeout) and restores the
file. A mutant is *killed* when that run fails (a failing test, an error, a crash or
a timeout) and *survives* when every selected test passes.

Before any mutant runs, each distinct test selection runs once on the unmutated copy:
a selection that fails there, selects nothing or skips everything makes its mutants
an ERROR (a kill would prove nothing). So does a mutant whose ``original`` snippet
no longer occurs exactly once in its file, or whose mutated Python does not compile:
the catalogue cannot rot silently.

On a machine without a GPU the suites run in the Triton interpreter, and mutants of
CUDA sources or of branches that only compiled Triton takes are skipped (``gpu_only``);
on a GPU everything runs compiled. Results are printed as a table and written as
records (suite ``mutants``: outcome ``passed`` when killed, ``failed`` when it
survived, ``error`` for a catalogue error, ``skipped``; metrics ``killed_by``,
``seconds``) with a manifest into a run directory that ``python -m harness report``
renders.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..records import (
    RECORDS_FILE,
    Record,
    read_records,
    utc_now,
)
from ..run.streamed_run import StreamedRun, positive_float, positive_int
from ..run.subproc import ChildGroups, run_killable
from .mutant_catalogue import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 600
BAD = ("failed", "error", "crashed", "timeout")
_SKIP_DIRS = {".git", "__pycache__", ".nox", ".venv", "reports", ".pytest_cache", ".ruff_cache",
              ".hypothesis", "build", "shared"}


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``original`` (which must occur exactly once) by ``mutated``.

    ``select``: pytest paths or node ids (``file::test``) that must catch it, cheapest
    first; ``k``: a ``-k`` expression applied to them (device-neutral: on CPU it picks
    the ``cpu-*`` cases, on a GPU box the ``cuda-*`` ones). ``gpu_only``: the code only
    runs on a GPU (CUDA source, or a branch only compiled Triton takes);
    ``interpreter_only``: the code is a branch only the Triton interpreter takes (its
    compiled twin has a mutant of its own). ``ci``: part of the CI-sized subset.
    """

    name: str
    path: str
    original: str
    mutated: str
    breaks: str
    select: tuple[str, ...]
    k: str | None = None
    gpu_only: bool = False
    ci: bool = False
    interpreter_only: bool = False

    @property
    def selection(self) -> tuple[tuple[str, ...], str | None]:
        return self.select, self.k


_REQUIRED = ("name", "path", "original", "mutated", "breaks", "select")


def mutant_of(entry: Mapping) -> Mutant:
    """One entry of the catalogue (harness/checks/mutant_catalogue.py) as a :class:`Mutant`;
    ValueError for a key missing or unknown."""
    missing = [key for key in _REQUIRED if key not in entry]
    unknown = sorted(set(entry) - {f.name for f in fields(Mutant)})
    if missing or unknown:
        raise ValueError(f"catalogue entry {entry.get('name', '?')!r}: missing {missing}, unknown {unknown}")
    select = entry["select"]
    return Mutant(**{**entry, "select": (select,) if isinstance(select, str) else tuple(select)})


CATALOGUE: tuple[Mutant, ...] = tuple(mutant_of(entry) for entry in MUTANTS)
MUTANT_NAMES = tuple(m.name for m in CATALOGUE)


# ------------------------------------------------------------------------------ applying
class CatalogueError(ValueError):
    """A mutant that cannot be applied to the current sources."""


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's substitution made; CatalogueError unless it occurs exactly once."""
    count = text.count(mutant.original)
    if count != 1:
        where = "no longer occurs" if count == 0 else f"occurs {count} times"
        raise CatalogueError(f"{mutant.name}: the original snippet {where} in {mutant.path}: "
                             f"{mutant.original.strip()[:80]!r}")
    if mutant.mutated == mutant.original:
        raise CatalogueError(f"{mutant.name}: the mutated snippet equals the original")
    mutated = text.replace(mutant.original, mutant.mutated)
    if mutant.path.endswith(".py"):
        try:
            compile(mutated, mutant.path, "exec")
        except SyntaxError as exc:
            raise CatalogueError(f"{mutant.name}: the mutated {mutant.path} does not compile: {exc}") from exc
    return mutated


def catalogue_problems(mutants: Iterable[Mutant] = CATALOGUE, root: Path = ROOT) -> list[str]:
    """Every reason a mutant cannot run as written against the sources under ``root``."""
    problems = []
    seen: set[str] = set()
    for mutant in mutants:
        if mutant.name in seen:
            problems.append(f"{mutant.name}: duplicate name")
        seen.add(mutant.name)
        source = root / mutant.path
        if not source.is_file():
            problems.append(f"{mutant.name}: no file {mutant.path}")
            continue
        try:
            apply(mutant, source.read_text(encoding="utf-8"))
        except CatalogueError as exc:
            problems.append(str(exc))
        for target in mutant.select:
            if not (root / target.split("::", 1)[0]).is_file():
                problems.append(f"{mutant.name}: selected test file {target.split('::', 1)[0]} does not exist")
    return problems


# ------------------------------------------------------------------------------ running
@dataclass
class Result:
    mutant: Mutant
    status: str  # killed | survived | error | skipped
    killed_by: str | None = None
    seconds: float = 0.0
    detail: str = ""

    OUTCOME = {"killed": "passed", "survived": "failed", "error": "error", "skipped": "skipped"}

    @property
    def outcome(self) -> str:
        return self.OUTCOME[self.status]


@dataclass
class RunOutput:
    """What one pytest run in a copy gave."""

    rc: int | None  # None: killed at the timeout
    seconds: float
    records: list[Record] = field(default_factory=list)
    tail: str = ""

    @property
    def first_bad(self) -> Record | None:
        return next((r for r in self.records if r.outcome in BAD), None)

    @property
    def n_passed(self) -> int:
        return sum(r.outcome == "passed" for r in self.records)


def project_files(root: Path = ROOT) -> list[str]:
    """Files of the working tree (tracked and untracked-but-not-ignored; all files outside git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True, timeout=60)
        files = [f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return sorted(f for f in files if (root / f).is_file() and f.split("/", 1)[0] not in _SKIP_DIRS)


def make_copy(dest: Path, root: Path = ROOT, files: Sequence[str] | None = None) -> Path:
    for rel in files if files is not None else project_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return dest


def verify_copy(copy: Path) -> Path:
    """Make sure a child process in ``copy`` imports the copy's ``kvbits`` (not an installed or
    editable one), or every mutant would silently test the original sources."""
    probe = "import importlib.util as u; print(u.find_spec('kvbits').origin)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=child_env(copy), capture_output=True,
                         text=True, timeout=120)
    origin = Path(out.stdout.strip() or "?").resolve()
    if out.returncode != 0 or copy.resolve() not in origin.parents:
        raise RuntimeError(f"a process in the copy {copy} imports kvbits from {origin}, not from the copy: "
                           f"{out.stderr.strip()[-500:]}")
    return copy


def pytest_argv(select: Sequence[str], k: str | None, results_dir: Path, python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "pytest", *select, "-x", "-q", "-p", "no:cacheprovider",
            "--results-dir", str(results_dir), "--leg", "mutant"]
    return argv + (["-k", k] if k else [])


def child_env(copy: Path, environ=os.environ) -> dict:
    env = {k: v for k, v in environ.items() if k not in ("KVH_RESULTS_DIR", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a same-size mutant in the same second must not reuse a .pyc
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_selection(copy: Path, select: Sequence[str], k: str | None, timeout_s: float, scratch: Path,
                  groups: ChildGroups | None = None) -> RunOutput:
    """Run pytest on ``select`` in ``copy``; its records go to a fresh ``scratch`` directory.
    ``groups`` registers the pytest process so that an interrupt can kill it from another thread."""
    shutil.rmtree(scratch, ignore_errors=True)
    rc, out, seconds = run_killable(pytest_argv(select, k, scratch), env=child_env(copy), cwd=copy,
                                    timeout_s=timeout_s, groups=groups)
    records = read_records(scratch / RECORDS_FILE).records if (scratch / RECORDS_FILE).exists() else []
    return RunOutput(rc, seconds, records, out[-3000:])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("records:")]
    return lines[-1] if lines else ""


def clean_problem(run: RunOutput) -> str | None:
    """Why an unmutated run of a selection cannot serve to judge mutants (None when it can)."""
    if run.rc is None:
        return f"the unmutated selection did not finish within the timeout ({run.seconds:.0f} s)"
    if run.rc == 0 and run.n_passed:
        return None
    if run.rc == 0:
        return "every selected test was skipped on the unmutated sources"
    if run.rc == 5:
        return "the selection collects no test"
    bad = run.first_bad
    if bad is not None:
        return f"fails on the unmutated sources: {bad.nodeid} ({bad.outcome})"
    return f"pytest exit {run.rc} on the unmutated sources: {_last_line(run.tail)}"


def judge(mutant: Mutant, run: RunOutput) -> Result:
    """Killed, survived or error, from the mutant's pytest run."""
    if run.rc is None:
        return Result(mutant, "killed", f"timeout (no result within {run.seconds:.0f} s)", run.seconds,
                      "the run was stopped at the per-mutant timeout")
    if run.rc == 0:
        if not run.n_passed:
            return Result(mutant, "error", None, run.seconds, "every selected test was skipped")
        return Result(mutant, "survived", None, run.seconds, f"{run.n_passed} selected tests passed")
    if run.rc in (3, 4, 5):
        return Result(mutant, "error", None, run.seconds, f"pytest exit {run.rc}: {_last_line(run.tail)}")
    bad = run.first_bad
    if bad is not None:
        why = (bad.message or "").strip().splitlines()
        detail = next((line for line in why if line.startswith("E ")), why[-1] if why else "")
        return Result(mutant, "killed", bad.nodeid, run.seconds, detail.strip()[:300])
    if run.rc < 0:
        return Result(mutant, "killed", f"pytest died (signal {-run.rc})", run.seconds, _last_line(run.tail))
    return Result(mutant, "killed", f"pytest exit {run.rc}", run.seconds, _last_line(run.tail))


class Workspace:
    """Copies of the project, one per worker, lent out one at a time; every pytest run in them
    is registered in :attr:`children`."""

    def __init__(self, jobs: int, root: Path = ROOT) -> None:
        self.children = ChildGroups()
        self.base = Path(tempfile.mkdtemp(prefix="kvh-mutants-"))
        files = project_files(root)
        self.pool: queue.Queue[Path] = queue.Queue()
        for i in range(jobs):
            self.pool.put(verify_copy(make_copy(self.base / f"w{i}", root, files)))

    def run(self, select, k, timeout_s, mutant: Mutant | None = None) -> tuple[RunOutput | None, str | None]:
        """Run a selection in a free copy, with ``mutant`` applied for the run; (output, problem)."""
        copy = self.pool.get()
        source = copy / mutant.path if mutant else None
        original = source.read_text(encoding="utf-8") if source else None
        try:
            if mutant:
                source.write_text(apply(mutant, original), encoding="utf-8")
            return run_selection(copy, select, k, timeout_s, copy / ".mutant-run", self.children), None
        except CatalogueError as exc:
            return None, str(exc)
        finally:
            if source is not None:
                source.write_text(original, encoding="utf-8")
            self.pool.put(copy)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def _unrunnable(mutant: Mutant, gpu: bool, root: Path) -> Result | None:
    """The result of a mutant that is not run here (a catalogue error, or code this device does
    not execute); None for one that runs."""
    problem = next(iter(catalogue_problems([mutant], root)), None)
    if problem:
        return Result(mutant, "error", None, 0.0, problem)
    if mutant.gpu_only and not gpu:
        return Result(mutant, "skipped", None, 0.0, "needs a GPU (CUDA source or compiled-Triton branch)")
    if mutant.interpreter_only and gpu:
        return Result(mutant, "skipped", None, 0.0, "a branch only the Triton interpreter takes")
    return None


def _unclean_selections(runnable: Sequence[Mutant], workspace: Workspace, pool: ThreadPoolExecutor,
                        timeout_s: float, progress) -> dict[tuple, str]:
    """Each distinct selection run once on the unmutated sources: why each that cannot judge
    its mutants cannot."""
    unclean: dict[tuple, str] = {}
    selections = list(dict.fromkeys(m.selection for m in runnable))
    runs = pool.map(lambda s: workspace.run(*s, timeout_s), selections)
    for selection, (run, _) in zip(selections, runs, strict=True):
        problem = clean_problem(run)
        if problem:
            unclean[selection] = problem
            progress(f"  clean check FAILED {' '.join(selection[0])} -k {selection[1]}: {problem}")
    return unclean


def run_mutants(mutants: Sequence[Mutant], *, jobs: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
                gpu: bool | None = None, check_clean: bool = True, root: Path = ROOT,
                progress=print, on_result=None) -> list[Result]:
    """Run each mutant against its selection in copies of ``root``; results in catalogue order.
    ``on_result(result)`` is called as each result is known (from worker threads), so that a
    run cut short keeps what it finished. An interrupt (or any exception) in the calling
    thread kills the pytest runs of every worker and reaches the caller once they are gone."""
    def known(result: Result) -> Result:
        if on_result is not None:
            on_result(result)
        return result

    gpu = gpu_available() if gpu is None else gpu
    results: dict[str, Result] = {}
    runnable = []
    for mutant in mutants:
        result = _unrunnable(mutant, gpu, root)
        if result is None:
            runnable.append(mutant)
        else:
            results[mutant.name] = known(result)
    if not runnable:
        return [results[m.name] for m in mutants]
    workspace = Workspace(max(1, min(jobs, len(runnable))), root)
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        unclean = _unclean_selections(runnable, workspace, pool, timeout_s, progress) if check_clean else {}

        def one(mutant: Mutant) -> Result:
            if mutant.selection in unclean:
                return known(Result(mutant, "error", None, 0.0, unclean[mutant.selection]))
            run, problem = workspace.run(*mutant.selection, timeout_s, mutant)
            result = Result(mutant, "error", None, 0.0, problem) if problem else judge(mutant, run)
            progress(f"  {result.status:<8} {mutant.name} ({result.seconds:.1f} s)"
                     + (f" by {result.killed_by}" if result.killed_by else f": {result.detail}"))
            return known(result)

        for result in pool.map(one, runnable):
            results[result.mutant.name] = result
    except BaseException:
        workspace.children.kill_all()  # the workers' pytest runs are in sessions of their own
        raise
    finally:
        try:
            pool.shutdown(wait=True, cancel_futures=True)  # prompt: their children are dead, no new one starts
        finally:
            workspace.close()
    return [results[m.name] for m in mutants]


# ------------------------------------------------------------------------------ reporting
def kill_rate(results: Sequence[Result]) -> tuple[int, int]:
    """(killed, judged): judged counts killed and survived mutants (errors and skips excluded)."""
    killed = sum(r.status == "killed" for r in results)
    return killed, killed + sum(r.status == "survived" for r in results)


def table(results: Sequence[Result]) -> str:
    rows = [("mutant", "file", "what it breaks", "killed by", "time", "result")]
    for r in results:
        killer = (r.killed_by or (r.detail if r.status != "killed" else "")).removeprefix("suites/")
        rows.append((r.mutant.name, r.mutant.path.removeprefix("kvbits/"), r.mutant.breaks, killer,
                     f"{r.seconds:.1f}s", r.status.upper() if r.status != "killed" else "killed"))
    limits = (34, 30, 60, 80, 7, 8)
    cells = [[c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(row, limits, strict=True)] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(limits))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    killed, judged = kill_rate(results)
    counts = {s: sum(r.status == s for r in results) for s in ("survived", "error", "skipped")}
    lines.append(f"kill rate {killed}/{judged}" + "".join(f", {n} {s}" for s, n in counts.items() if n))
    return "\n".join(lines)


def result_record(r: Result, gpu: bool) -> Record:
    message = r.detail if r.status != "killed" else (f"killed by {r.killed_by}: {r.detail}" if r.detail else None)
    return Record(
        suite="mutants", group="harness", case=r.mutant.name, nodeid=f"harness/mutants::{r.mutant.name}",
        outcome=r.outcome, duration_s=round(r.seconds, 3), backend=_backend_of(r.mutant),
        variant=r.mutant.path, device="cuda" if gpu else "cpu",
        metrics={"killed_by": r.killed_by or "", "seconds": round(r.seconds, 2), "breaks": r.mutant.breaks},
        message=message,
    )


def open_run(run_dir: Path, *, leg: str | None, args: Sequence[str], started: str) -> StreamedRun:
    """The run directory that mutant records stream into (suite ``mutants``), readable by the report."""
    return StreamedRun(run_dir, kind="mutants", leg=leg, args=args, started=started)


def finish_run(run: StreamedRun, results: Sequence[Result]) -> None:
    killed, judged = kill_rate(results)
    run.finish(kill_rate=f"{killed}/{judged}")


def write_results(results: Sequence[Result], run_dir: Path, *, leg: str | None, args: Sequence[str],
                  started: str, gpu: bool) -> None:
    """Records and a manifest in ``run_dir`` at once, for results already in hand."""
    run = open_run(run_dir, leg=leg, args=args, started=started)
    for result in results:
        run.add(result_record(result, gpu))
    finish_run(run, results)


def _backend_of(mutant: Mutant) -> str:
    if mutant.path.endswith(".cu"):
        return "cuda"
    if mutant.path.endswith(".cpp"):
        return "cpp"
    return "triton" if "tl." in mutant.original + mutant.mutated or "range(" in mutant.original else "torch"


def select_mutants(only: Sequence[str] | None, ci: bool, match: Sequence[str] | None = None) -> list[Mutant]:
    """The catalogue, or its CI subset; narrowed to ``only`` (exact names) and to names or
    paths containing one of ``match``."""
    chosen = [m for m in CATALOGUE if m.ci] if ci else list(CATALOGUE)
    if match:
        chosen = [m for m in chosen if any(s in m.name or s in m.path for s in match)]
    if only:
        unknown = [n for n in only if n not in MUTANT_NAMES]
        if unknown:
            raise ValueError(f"unknown mutant(s) {unknown}; known: {', '.join(MUTANT_NAMES)}")
        chosen = [m for m in chosen if m.name in only]
    return chosen


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.checks.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only (see --list)")
    parser.add_argument("--match", nargs="+", metavar="TEXT",
                        help="run the mutants whose name or file contains one of these (e.g. int8 decode)")
    parser.add_argument("--list", action="store_true", help="print the catalogue (and any catalogue error) and exit")
    parser.add_argument("--ci", action="store_true", help="the CI-sized subset (a few minutes on 2 CPU cores)")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="run directory for the records (default reports/runs/mutants-<UTC time>)")
    parser.add_argument("--jobs", type=positive_int, default=1, metavar="N", help="mutants run in parallel (default 1)")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds one mutant's pytest run may take (default %(default)s)")
    parser.add_argument("--no-clean-check", action="store_true",
                        help="skip the run of each selection on the unmutated sources")
    parser.add_argument("--leg", default=None, help="version-leg name stored in the records")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        mutants = select_mutants(args.only, args.ci, args.match)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not mutants:
        print("no mutant matches the selection", file=sys.stderr)
        return 2
    if args.list:
        problems = catalogue_problems(mutants)
        for m in mutants:
            flags = ",".join(f for f, on in (("gpu-only", m.gpu_only), ("cpu-only", m.interpreter_only),
                                             ("ci", m.ci)) if on)
            print(f"{m.name:<36} {m.path:<30} {flags:<12} {m.breaks}")
        print(f"{len(mutants)} mutants ({sum(not m.gpu_only for m in mutants)} run on CPU)")
        for problem in problems:
            print(f"CATALOGUE ERROR: {problem}")
        return 1 if problems else 0
    gpu = gpu_available()
    started = utc_now()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path(args.results_dir or ROOT / "reports" / "runs" / f"mutants-{stamp}")
    where = "compiled on the GPU" if gpu else "in the Triton interpreter on CPU (gpu-only mutants skipped)"
    print(f"[mutants] {len(mutants)} mutants, {args.jobs} job(s), {where}", flush=True)
    start = time.perf_counter()
    try:
        run = open_run(run_dir, leg=args.leg, args=sys.argv[1:] if argv is None else list(argv), started=started)
    except OSError as exc:
        print(f"[mutants] cannot write the run directory {run_dir}: {exc}", file=sys.stderr, flush=True)
        return 2
    results = run_mutants(mutants, jobs=args.jobs, timeout_s=args.timeout, gpu=gpu,
                          check_clean=not args.no_clean_check, progress=lambda s: print(s, flush=True),
                          on_result=lambda r: run.add(result_record(r, gpu)))
    finish_run(run, results)
    print(table(results), flush=True)
    print(f"[mutants] {time.perf_counter() - start:.0f} s in all", flush=True)
    print(f"records: {run_dir / RECORDS_FILE}", flush=True)
    return 0 if all(r.status in ("killed", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
