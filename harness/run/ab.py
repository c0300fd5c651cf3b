"""Same-job A/B of two commits: the benchmarks of a base commit and this working tree, in turns.

Both trees are timed in one job on one device, so that the spread between jobs (5-25% on the
same GPU model) stays out of the ratio.

``python -m harness.run.ab [BASE] [options] [pytest args]`` (also ``python -m harness ab`` and
``nox -s ab -- BASE``). BASE, when given, is the first argument: a git ref (default: the merge
base of HEAD with ``main``). The base is checked out in a git worktree in a temporary
directory, removed afterwards whatever happens; the head is the working tree as it is,
uncommitted changes included. Each of ``--rounds`` rounds runs the selected benchmark cases
once in each tree, base first in odd rounds and head first in even ones, each run a pytest
run of that tree with the harness plugin recording into ``reports/runs/ab-<side>-<round>``,
all on the same GPU (``CUDA_VISIBLE_DEVICES`` fixed to one device) or, without one, on CPU.
The selection is the ``suites/test_bench_*.py`` cases of marker ``bench and not sweep``;
pytest arguments narrow it (``-k decode``, test paths) or widen it (``-m bench``).

Then ``reports/ab.json`` (harness/run/ab_results.py; the statistics in
harness/measure/ab_stats.py), its Markdown table appended to ``reports/ab-summary.md``, a page
``reports/ab.html`` (the last head run with the A/B section) and, on a GPU, the runs in the
run history (their run ids name the side and round: ``<leg>@ab-base-3@<start>``). The exit
code is 0 when every run passed, 1 when one failed (the A/B stops there; the figures of the
runs before are written) or the page could not be rendered, 2 when nothing could start.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import ab_results, commands, legs, pipeline
from .ab_results import AB_FILE, SIDES, RoundRun
from .subproc import REPO_ROOT

DEFAULT_ROUNDS = 5
DEFAULT_BRANCH = "main"
AB_PAGE = "ab.html"
SUMMARY_FILE = "ab-summary.md"  # the A/B family's own, beside gpu_verify-summary.md
BENCH_GLOB = "suites/test_bench_*.py"
RUN_PREFIX = "ab-"


class AbError(RuntimeError):
    """The A/B cannot start: no git repository, an unknown BASE, no git."""


def _say(text: str) -> None:
    print(f"[kvh ab] {text}", flush=True)


# -- git -----------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    """The stripped output of ``git -C repo ARGS``; AbError with git's message when it fails."""
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AbError(f"git {' '.join(args)}: {exc}") from exc
    if out.returncode != 0:
        raise AbError(f"git {' '.join(args)}: {(out.stderr.strip() or out.stdout.strip() or 'failed')}")
    return out.stdout.strip()


def toplevel(path: Path) -> Path:
    return Path(git(path, "rev-parse", "--show-toplevel"))


def resolve_commit(repo: Path, ref: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except AbError:
        raise AbError(f"BASE {ref!r} names no commit of {repo}") from None


def default_base(repo: Path, branch: str = DEFAULT_BRANCH) -> str:
    """The merge base of HEAD with ``branch`` (or ``origin/<branch>``)."""
    for candidate in (branch, f"origin/{branch}"):
        try:
            return git(repo, "merge-base", "HEAD", candidate)
        except AbError:
            continue
    raise AbError(f"no merge base of HEAD with {branch!r} or 'origin/{branch}': name BASE")


def dirty(repo: Path) -> bool:
    """Whether tracked files differ from HEAD (what the head tree runs that no commit holds)."""
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


@contextmanager
def base_worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached git worktree of ``commit`` in a temporary directory, removed on the way out,
    whether the body finished, raised or was interrupted."""
    tmp = Path(tempfile.mkdtemp(prefix="kvh-ab-"))
    tree = tmp / "base"
    try:
        git(repo, "worktree", "prune")  # entries an earlier, killed A/B left behind
        git(repo, "worktree", "add", "--detach", str(tree), commit)
        yield tree
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False)


# -- what runs -------------------------------------------------------------------------------------


def round_order(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in run order: base then head in odd rounds, head then base in even ones, so
    that a drift over the job weighs on both sides alike."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return [(n, side) for n in range(1, rounds + 1) for side in (SIDES if n % 2 else SIDES[::-1])]


def round_dir(reports_dir: Path, side: str, number: int) -> Path:
    return reports_dir / commands.RUNS_SUBDIR / f"{RUN_PREFIX}{side}-{number}"


def is_test_path(arg: str, tree: Path) -> bool:
    """Whether a pytest argument names tests by path (``suites/x.py``, ``suites/x.py::test``)."""
    return not arg.startswith("-") and ("::" in arg or (tree / arg).exists())


@dataclass
class BenchCommand:
    """The pytest run of one side: the tree's benchmark files (or the paths in ``selection``)
    with the harness plugin recording into the round's run directory."""

    python: str = sys.executable
    leg: str = ""
    marker: str = commands.HEADLINE_BENCH
    timeout: int | None = None
    selection: Sequence[str] = ()

    def __call__(self, tree: Path, results_dir: Path) -> list[str]:
        paths = [a for a in self.selection if is_test_path(a, tree)]
        extra = [a for a in self.selection if a not in paths]
        if not paths:
            paths = sorted(p.relative_to(tree).as_posix() for p in tree.glob(BENCH_GLOB))
        return commands.pytest_command(self.python, paths, marker=self.marker, results_dir=str(results_dir),
                                       leg=self.leg, timeout=self.timeout, extra=extra)


@dataclass
class Setup:
    """One A/B: the trees, the rounds, where results go and what each run is."""

    repo: Path
    base_ref: str
    rounds: int = DEFAULT_ROUNDS
    reports_dir: Path = Path(commands.REPORTS_DIR)
    command: Callable[[Path, Path], list[str]] = field(default_factory=BenchCommand)
    env: Mapping[str, str] = field(default_factory=dict)
    device: str | None = None
    gpu: str | None = None
    leg: str = ""
    history: Path | str | None = None  # the run history (a file or a URL) to append the runs to; None: not kept
    summary: Path | None = None  # the Markdown file the table is appended to (default: <reports>/ab-summary.md)


@dataclass
class Outcome:
    ab: dict
    failed: RoundRun | None

    @property
    def ok(self) -> bool:
        return self.failed is None


def _run(argv: list[str], tree: Path, env: Mapping[str, str]) -> int:
    try:
        return subprocess.run(argv, cwd=tree, env={**os.environ, **env}).returncode
    except OSError as exc:
        _say(f"could not start {argv[0]}: {exc}")
        return 127


def _check_commit(run: RoundRun, expected: str) -> None:
    """Say so when a run's manifest records another commit than its tree's (code imported from
    elsewhere would make the A/B compare nothing)."""
    from ..records import read_manifest

    commit = (read_manifest(run.run_dir).get("env") or {}).get("commit")
    if commit and not str(commit).startswith(expected):
        _say(f"warning: the {run.side} run of round {run.round} recorded commit {commit}, not {expected}")


def run_ab(setup: Setup) -> Outcome:
    """The rounds, then ``ab.json``, the Markdown table and the run history; the base worktree
    exists only while the rounds run."""
    repo = Path(setup.repo).resolve()
    reports_dir = Path(setup.reports_dir).resolve()
    base_commit = resolve_commit(repo, setup.base_ref)
    head = {"ref": "HEAD", "commit": git(repo, "rev-parse", "HEAD"), "dirty": dirty(repo)}
    base = {"ref": setup.base_ref, "commit": base_commit}
    if base_commit == head["commit"] and not head["dirty"]:
        _say(f"warning: BASE {setup.base_ref} is HEAD and the tree is clean: both sides run the same code")
    order = round_order(setup.rounds)
    for side in SIDES:
        for old in (reports_dir / commands.RUNS_SUBDIR).glob(f"{RUN_PREFIX}{side}-*"):
            shutil.rmtree(old, ignore_errors=True)  # an earlier A/B's runs are not this one's
    (reports_dir / AB_FILE).unlink(missing_ok=True)
    runs: list[RoundRun] = []
    failed = None
    with base_worktree(repo, base_commit) as base_tree:
        trees = {"base": base_tree, "head": repo}
        expected = {"base": base_commit, "head": head["commit"]}
        for number, side in order:
            out = round_dir(reports_dir, side, number)
            argv = setup.command(trees[side], out)
            _say(f"round {number}/{setup.rounds} {side}: {subprocess.list2cmdline(argv)}")
            start = time.perf_counter()
            rc = _run(argv, trees[side], setup.env)
            run = RoundRun(number, side, out, rc, time.perf_counter() - start)
            runs.append(run)
            _say(f"round {number}/{setup.rounds} {side}: exit {rc} after {run.seconds:.1f} s")
            _check_commit(run, expected[side])
            if rc != 0:
                failed = run
                _say(f"round {number} {side} failed: the A/B stops here")
                break
    ab = ab_results.build(runs, rounds=setup.rounds, base=base, head=head, root=reports_dir, order=order,
                          device=setup.device, gpu=setup.gpu, leg=setup.leg, failed=failed)
    path = ab_results.write(reports_dir / AB_FILE, ab)
    summary = Path(setup.summary) if setup.summary else reports_dir / SUMMARY_FILE
    summary.parent.mkdir(parents=True, exist_ok=True)
    with open(summary, "a", encoding="utf-8") as fh:
        fh.write("\n" + ab_results.markdown(ab))
    _say(f"{len(ab['cases'])} case(s) compared: {path}; table appended to {summary}")
    if setup.history is not None:
        pipeline.record_history([str(r.run_dir) for r in runs if r.run_dir.is_dir()], setup.history)
    return Outcome(ab, failed)


def render_page(reports_dir: Path, ab: dict, python: str = sys.executable) -> int:
    """``reports/ab.html``: the last head run's report with the A/B section."""
    heads = [d for d in ab_results.run_dirs_of(ab, reports_dir)
             if d.name.startswith(f"{RUN_PREFIX}head-") and d.is_dir()]
    if not heads:
        _say("report: no head run to render")
        return 1
    argv = [python, "-m", "harness", "report", str(heads[-1]), "-o", str(reports_dir / AB_PAGE), "--no-junit",
            "--ab", str(reports_dir / AB_FILE), "--title", f"kv harness {ab_results.heading(ab)}"]
    _say(f"report: {subprocess.list2cmdline(argv)}")
    return subprocess.run(argv, cwd=REPO_ROOT, check=False).returncode  # the head's harness renders it


# -- command line ----------------------------------------------------------------------------------


def split_base(argv: Sequence[str], repo: Path) -> tuple[str | None, list[str]]:
    """BASE (the first argument, unless it is an option or a test path) and the rest."""
    if argv and not argv[0].startswith("-") and not is_test_path(argv[0], repo):
        return argv[0], list(argv[1:])
    return None, list(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.run.ab", description=__doc__.splitlines()[0], allow_abbrev=False,
        usage="%(prog)s [BASE] [options] [pytest args]",
        epilog="BASE: a git ref, the first argument (default: the merge base of HEAD with main). "
               "Other arguments go to pytest (-k decode, test paths, -m bench for the sweep too).")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help="rounds, each running both trees once (default %(default)s)")
    parser.add_argument("--reports-dir", default=commands.REPORTS_DIR)
    parser.add_argument("--device", default=None,
                        help="the CUDA device both trees run on (default: the first visible one)")
    parser.add_argument("--leg", default=None, help="version-leg name (default: from the installed torch/triton)")
    parser.add_argument("--timeout", type=int, default=commands.DEFAULT_TIMEOUT_S,
                        help="per-test timeout in seconds when pytest-timeout is installed (0: none)")
    parser.add_argument("--summary-md", default=None, metavar="PATH",
                        help="append the Markdown table to PATH (default: <reports-dir>/ab-summary.md)")
    parser.add_argument("--no-history", action="store_true", help="keep the runs out of the run history")
    parser.add_argument("--no-report", action="store_true", help="write ab.json and the table, no HTML page")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        repo = toplevel(Path.cwd())
        base_ref, rest = split_base(argv, repo)
        args, selection = parser.parse_known_args(rest)
        if args.rounds < 1:
            parser.error(f"--rounds must be at least 1, got {args.rounds}")
        base_ref = base_ref or default_base(repo)
        resolve_commit(repo, base_ref)
    except AbError as exc:
        _say(str(exc))
        return 2
    python = sys.executable
    info = pipeline.probe(python)
    if not (info.get("torch") and info.get("triton")):
        _say(f"cannot import torch and triton with {python}: {info.get('error')}")
        return 2
    gpus = pipeline.visible_devices(info["count"])
    device = args.device or (gpus[0] if gpus else None)
    gpu = dict(zip(gpus, info["names"], strict=False)).get(device)
    leg = args.leg or legs.stack_leg_name(info["torch"], info["triton"], gpu=device is not None)
    env = {**commands.GPU_ENV, **commands.pinned_env(device)} if device is not None else dict(commands.INTERPRETER_ENV)
    if device is None:
        print(pipeline.FALLBACK_NOTICE, flush=True)
    has_timeout = importlib.util.find_spec("pytest_timeout") is not None
    command = BenchCommand(python=python, leg=leg, timeout=(args.timeout or None) if has_timeout else None,
                           selection=selection)
    reports_dir = Path(args.reports_dir)
    history = None
    if device is not None and not args.no_history:
        from .. import history as run_history

        history = run_history.history_location()
    _say(f"head {repo} against base {base_ref}, {args.rounds} round(s) on "
         f"{'GPU ' + device + (f' ({gpu})' if gpu else '') if device is not None else 'CPU'}; leg {leg}")
    try:
        outcome = run_ab(Setup(repo=repo, base_ref=base_ref, rounds=args.rounds, reports_dir=reports_dir,
                               command=command, env=env, device=device, gpu=gpu, leg=leg, history=history,
                               summary=Path(args.summary_md) if args.summary_md else None))
    except AbError as exc:
        _say(str(exc))
        return 2
    failed = not outcome.ok
    if not args.no_report:
        failed |= render_page(reports_dir.resolve(), outcome.ab, python) != 0
    counts = outcome.ab["counts"]
    _say(f"{'FAILED' if failed else 'done'}: {counts['slower']} slower, {counts['faster']} faster, "
         f"{counts['within noise']} within noise; {reports_dir / AB_FILE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
