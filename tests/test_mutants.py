"""The mutation runner: its catalogue applies to today's sources, it kills a planted bug end to
end in a copy of the project, and it reports a harmless edit as surviving."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from processes import SigintWhen, ended

from harness.checks import mutants
from harness.records import MANIFEST_FILE, RECORDS_FILE, Record, read_records
from harness.report import load_results, summarize
from harness.report.cli import main as report_main

ROOT = Path(__file__).resolve().parents[1]


def test_every_catalogue_snippet_applies_to_the_current_sources():
    assert mutants.catalogue_problems() == []
    assert len(mutants.CATALOGUE) >= 20
    assert len({m.name for m in mutants.CATALOGUE}) == len(mutants.CATALOGUE)
    on_cpu = [m for m in mutants.CATALOGUE if not m.gpu_only]
    assert len(on_cpu) >= 20, "at least 20 mutants must run without a GPU"
    for m in mutants.CATALOGUE:
        assert m.select and m.breaks and m.original != m.mutated, m.name
        source = (ROOT / m.path).read_text(encoding="utf-8")
        assert source.count(m.original) == 1, m.name


def test_the_ci_subset_covers_every_kernel_family():
    ci = mutants.select_mutants(None, ci=True)
    assert all(not m.gpu_only for m in ci), "the CI subset runs on CPU"
    files = {m.path for m in ci}
    for path in ("kvbits/packing.py", "kvbits/int8.py", "kvbits/affine.py", "kvbits/kv_cache.py",
                 "kvbits/decode/kernel.py"):
        assert path in files, f"no CI mutant in {path}"
    assert 5 <= len(ci) <= 12


def test_apply_refuses_a_missing_a_repeated_or_a_broken_snippet():
    m = mutants.Mutant("x", "kvbits/packing.py", "a + b", "a - b", "sign", ("suites/test_golden.py",))
    assert mutants.apply(m, "y = a + b\n") == "y = a - b\n"
    with pytest.raises(mutants.CatalogueError, match="no longer occurs"):
        mutants.apply(m, "y = a * b\n")
    with pytest.raises(mutants.CatalogueError, match="occurs 2 times"):
        mutants.apply(m, "y = a + b\nz = a + b\n")
    broken = dataclasses.replace(m, mutated="a - (b")
    with pytest.raises(mutants.CatalogueError, match="does not compile"):
        mutants.apply(broken, "y = a + b\n")
    missing_file = dataclasses.replace(m, path="kvbits/no_such_module.py")
    missing_test = dataclasses.replace(m, name="y", select=("suites/test_no_such_suite.py",))
    problems = mutants.catalogue_problems([missing_file, missing_test])
    assert any("no file kvbits/no_such_module.py" in p for p in problems)
    assert any("test_no_such_suite.py does not exist" in p for p in problems)


def _record(nodeid: str, outcome: str, message: str | None = None) -> Record:
    return Record(suite="s", case=nodeid.split("::")[-1], nodeid=nodeid, outcome=outcome, message=message)


M = mutants.CATALOGUE[0]


@pytest.mark.parametrize(("run", "status", "killed_by"), [
    (mutants.RunOutput(0, 1.0, [_record("a::t1", "passed")]), "survived", None),
    (mutants.RunOutput(0, 1.0, [_record("a::t1", "skipped")]), "error", None),
    (mutants.RunOutput(1, 1.0, [_record("a::t1", "passed"), _record("a::t2", "failed", "E   assert 3 == 0")]),
     "killed", "a::t2"),
    (mutants.RunOutput(2, 1.0, [], "ImportError while importing"), "killed", "pytest exit 2"),
    (mutants.RunOutput(-11, 1.0, [_record("a::t1", "passed")]), "killed", "pytest died (signal 11)"),
    (mutants.RunOutput(None, 30.0, []), "killed", "timeout (no result within 30 s)"),
    (mutants.RunOutput(4, 1.0, [], "ERROR: not found: a::t9"), "error", None),
    (mutants.RunOutput(5, 1.0, [], "no tests ran"), "error", None),
], ids=["pass", "all-skipped", "fail", "collection", "segfault", "timeout", "not-found", "none-collected"])
def test_judging_a_run(run, status, killed_by):
    result = mutants.judge(M, run)
    assert (result.status, result.killed_by) == (status, killed_by)
    if status == "killed" and killed_by == "a::t2":
        assert result.detail == "E   assert 3 == 0"


@pytest.mark.parametrize(("run", "problem"), [
    (mutants.RunOutput(0, 1.0, [_record("a::t1", "passed")]), None),
    (mutants.RunOutput(0, 1.0, [_record("a::t1", "skipped")]), "every selected test was skipped"),
    (mutants.RunOutput(1, 1.0, [_record("a::t1", "failed")]), "fails on the unmutated sources: a::t1"),
    (mutants.RunOutput(5, 1.0, []), "collects no test"),
    (mutants.RunOutput(None, 9.0, []), "did not finish"),
])
def test_clean_runs_that_cannot_judge_mutants(run, problem):
    got = mutants.clean_problem(run)
    assert got is None if problem is None else problem in got


def test_device_bound_mutants_are_skipped_where_their_code_does_not_run():
    gpu_only = next(m for m in mutants.CATALOGUE if m.gpu_only)
    interpreted = next(m for m in mutants.CATALOGUE if m.interpreter_only)
    seen = []  # each result is handed on as it is known (the runner streams it into the run directory)
    on_cpu = mutants.run_mutants([gpu_only], gpu=False, progress=lambda s: None, on_result=seen.append)
    on_gpu = mutants.run_mutants([interpreted], gpu=True, progress=lambda s: None, on_result=seen.append)
    assert seen == [on_cpu[0], on_gpu[0]]
    assert (on_cpu[0].status, on_gpu[0].status) == ("skipped", "skipped")
    assert "needs a GPU" in on_cpu[0].detail and "interpreter" in on_gpu[0].detail
    assert on_cpu[0].outcome == "skipped"


def test_unknown_mutant_names_are_refused():
    with pytest.raises(ValueError, match="unknown mutant"):
        mutants.select_mutants(["no-such-mutant"], ci=False)
    assert [m.name for m in mutants.select_mutants([M.name], ci=False)] == [M.name]
    assert mutants.main(["--only", "no-such-mutant"]) == 2


def test_list_prints_the_catalogue(capsys):
    assert mutants.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(m.name in out for m in mutants.CATALOGUE)
    assert f"{len(mutants.CATALOGUE)} mutants" in out


def test_copy_holds_the_project_and_no_generated_files(tmp_path):
    files = mutants.project_files()
    assert "kvbits/packing.py" in files and "conftest.py" in files and "pyproject.toml" in files
    assert not any("__pycache__" in f or f.startswith(("reports/", ".git/")) for f in files)
    copy = mutants.make_copy(tmp_path / "copy", files=["kvbits/packing.py", "conftest.py"])
    assert (copy / "kvbits" / "packing.py").read_bytes() == (ROOT / "kvbits" / "packing.py").read_bytes()


def test_a_planted_bug_is_killed_and_a_harmless_edit_survives(tmp_path):
    """End to end in copies of the project: the v2 straddle bug fails the golden suite; an
    equivalent rewrite of the same line (2 << (b - 1) == 1 << b) passes it, so the runner
    can report survival. Neither touches this tree."""
    planted = next(m for m in mutants.CATALOGUE if m.name == "unpack-byte-v2-straddle")
    harmless = dataclasses.replace(planted, name="harmless-equivalent-mask", breaks="nothing",
                                   mutated=planted.original.replace("(1 << BITS) - 1", "(2 << (BITS - 1)) - 1"))
    assert harmless.mutated != planted.original
    before = (ROOT / planted.path).read_bytes()
    lines = []
    results = mutants.run_mutants([planted, harmless], jobs=1, timeout_s=300, gpu=False, progress=lines.append)
    assert (ROOT / planted.path).read_bytes() == before, "the runner must never touch the real sources"
    killed, survived = results
    assert killed.status == "killed", killed
    assert killed.killed_by.startswith("suites/test_golden.py::") and "triton" in killed.killed_by
    assert survived.status == "survived", survived
    assert "passed" in survived.detail

    run_dir = tmp_path / "mutants"
    mutants.write_results(results, run_dir, leg="leg-m", args=["--only", planted.name], started="t0", gpu=False)
    records = {r.case: r for r in read_records(run_dir / RECORDS_FILE).records}
    assert records[planted.name].outcome == "passed" and records[harmless.name].outcome == "failed"
    assert records[planted.name].metrics["killed_by"] == killed.killed_by
    assert records[planted.name].suite == "mutants" and records[planted.name].metrics["seconds"] > 0
    manifest = json.loads((run_dir / MANIFEST_FILE).read_text())
    assert manifest["complete"] is True and manifest["kill_rate"] == "1/2"
    table = mutants.table(results)
    assert "kill rate 1/2, 1 survived" in table and "SURVIVED" in table
    summary = summarize(load_results([run_dir]))
    assert summary.stats.counts["failed"] == 1
    html = tmp_path / "report.html"
    assert report_main(["report", str(run_dir), "-o", str(html)]) == 0
    assert harmless.name in html.read_text(encoding="utf-8")


def test_a_selection_failing_on_clean_sources_makes_its_mutants_errors(tmp_path):
    """A catalogue entry whose tests fail without any mutation proves nothing: ERROR, not killed."""
    stale = dataclasses.replace(mutants.CATALOGUE[0], name="stale-selection",
                                select=("suites/test_golden.py::test_no_such_test",))
    missing = dataclasses.replace(mutants.CATALOGUE[0], name="missing-snippet", original="no such code ()")
    seen = []
    results = mutants.run_mutants([stale, missing], jobs=1, timeout_s=120, gpu=False, progress=lambda s: None,
                                  on_result=seen.append)
    assert [r.status for r in results] == ["error", "error"]
    assert sorted(r.mutant.name for r in seen) == ["missing-snippet", "stale-selection"]
    assert "no longer occurs" in results[1].detail
    assert results[0].killed_by is None


def _tiny_project(root: Path) -> list[mutants.Mutant]:
    """A project of one module and three test files, and a mutant of each line selecting one."""
    (root / "kvbits").mkdir(parents=True)
    (root / "kvbits" / "__init__.py").write_text("")
    (root / "kvbits" / "code.py").write_text("x = 1\ny = 2\nz = 3\n")
    (root / "tests").mkdir()
    found = []
    for line, test in (("x = 1", "fast"), ("y = 2", "slow_a"), ("z = 3", "slow_b")):
        (root / "tests" / f"test_{test}.py").write_text("")
        found.append(mutants.Mutant(f"mutant-{test}", "kvbits/code.py", line, line + "0", "nothing",
                                    (f"tests/test_{test}.py",)))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs POSIX signals and /proc")
@pytest.mark.parametrize("jobs", [1, 3])
def test_a_real_interrupt_kills_every_running_pytest_and_keeps_the_finished_results(tmp_path, monkeypatch, jobs):
    """A SIGINT to the process while worker threads run mutants: each running test run's whole
    group is gone at once, the interrupt reaches the caller promptly, the result finished before
    it stays in the records, and no killed run becomes a result."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = f'case "$1" in *fast*) exit 1 ;; esac\nsleep 60 & echo "$$ $!" > {pids}/$(basename "$1")\nwait\n'
    monkeypatch.setattr(mutants, "pytest_argv", lambda select, k, results_dir, python=None: [
        "sh", "-c", script, "sh", select[0]])
    project = _tiny_project(tmp_path / "project")
    run = mutants.open_run(tmp_path / "run", leg="leg-m", args=[], started="t0")
    seen: list = []

    def ready() -> bool:
        return len(seen) == 1 and len(list(pids.iterdir())) == min(jobs, 2)

    with SigintWhen(ready) as interrupt, pytest.raises(KeyboardInterrupt):
        mutants.run_mutants(project, jobs=jobs, timeout_s=120, gpu=False, check_clean=False,
                            root=tmp_path / "project", progress=lambda s: None,
                            on_result=lambda r: (run.add(mutants.result_record(r, False)), seen.append(r)))
    assert interrupt.sent_at is not None and time.monotonic() - interrupt.sent_at < 10
    for marker in pids.iterdir():
        assert all(ended(int(pid)) for pid in marker.read_text().split()), marker.name
    time.sleep(0.5)  # what a worker would still record after the interrupt
    records = [(r.case, r.outcome) for r in read_records(tmp_path / "run" / RECORDS_FILE).records]
    assert records == [("mutant-fast", "passed")]


@pytest.mark.parametrize("option", [["--timeout", "0"], ["--timeout", "nan"], ["--jobs", "0"], ["--jobs", "-2"]])
def test_limits_must_be_positive(option):
    with pytest.raises(SystemExit):
        mutants.build_parser().parse_args(option)


def test_a_results_dir_that_is_a_file_is_refused(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert mutants.main(["--only", M.name, "--results-dir", str(taken)]) == 2
    assert "cannot write the run directory" in capsys.readouterr().err
