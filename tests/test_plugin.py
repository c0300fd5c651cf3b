"""The recording plugin, run on tiny inner suites through pytester."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.records import MANIFEST_FILE, RECORDS_FILE, read_records

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_pass(record):
    record.backend = "triton"
    record.variant = "splitk"
    record.device = "cpu"
    record.add(states_checked=2**24, bit_errors=0, max_abs_err=1.5e-3, speedup={"torch_eager": 3.0},
               shape="B=1 S=8")

def test_fail(record):
    record.add(max_abs_err=0.5)
    assert 0.5 <= 1e-3, "max_abs_err too large"

def test_error(broken):
    pass

def test_skip():
    pytest.skip("needs a CUDA device")

@pytest.mark.parametrize("n", [1, 2])
def test_param(n, record):
    record.add(states_checked=n)
'''


def _records(run_dir):
    result = read_records(run_dir / RECORDS_FILE)
    assert result.problems == []
    return {r.case: r for r in result.records}


def _manifest(run_dir):
    return json.loads((run_dir / MANIFEST_FILE).read_text())


def test_every_case_gets_one_record_with_its_metrics(pytester, tmp_path):
    pytester.makepyfile(test_inner=INNER)
    run_dir = tmp_path / "run"
    result = pytester.runpytest("-p", "harness.plugin", "--results-dir", str(run_dir), "--leg", "leg-A",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1, errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*kv harness records*", "leg leg-A (*): *", f"records: {run_dir}*"])
    records = _records(run_dir)
    assert {k: r.outcome for k, r in records.items()} == {
        "test_pass": "passed", "test_fail": "failed", "test_error": "error", "test_skip": "skipped",
        "test_param[1]": "passed", "test_param[2]": "passed"}
    ok = records["test_pass"]
    assert (ok.backend, ok.variant, ok.device, ok.leg, ok.suite) == ("triton", "splitk", "cpu", "leg-A", "inner")
    assert ok.metrics == {"states_checked": 2**24, "bit_errors": 0, "max_abs_err": 1.5e-3,
                          "speedup": {"torch_eager": 3.0}, "shape": "B=1 S=8"}
    assert records["test_fail"].metrics == {"max_abs_err": 0.5}
    assert "max_abs_err too large" in records["test_fail"].message
    assert "fixture broke" in records["test_error"].message
    assert records["test_skip"].message == "needs a CUDA device"  # the reason, not pytest's (path, line, text)
    assert records["test_param[2]"].metrics == {"states_checked": 2}
    manifest = _manifest(run_dir)
    assert manifest["complete"] is True and manifest["exitstatus"] == 1 and manifest["leg"] == "leg-A"
    assert manifest["counts"] == {"passed": 3, "failed": 1, "error": 1, "skipped": 1}
    assert manifest["env"]["python"] and manifest["mode"] in ("gpu", "interpreter")


def test_interrupted_run_is_marked_incomplete(pytester, tmp_path):
    pytester.makepyfile(test_stop='''
def test_first():
    pass

def test_interrupt():
    raise KeyboardInterrupt

def test_never_reached():
    pass
''')
    run_dir = tmp_path / "run"
    pytester.runpytest("-p", "harness.plugin", "--results-dir", str(run_dir), "-p", "no:cacheprovider",
                       no_reraise_ctrlc=True)
    records = _records(run_dir)
    assert records["test_first"].outcome == "passed"
    assert records["test_interrupt"].outcome == "crashed"
    assert "test_never_reached" not in records
    manifest = _manifest(run_dir)
    assert manifest["complete"] is False and manifest["exitstatus"] == 2


def _subprocess_env(monkeypatch) -> None:
    """A pytest child process that imports the harness and only the plugins its run names
    (faster workers)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_xdist_worker_death_leaves_a_crashed_record(pytester, tmp_path, monkeypatch):
    pytest.importorskip("xdist")
    path = pytester.makepyfile(test_crash='''
import os
import pytest


@pytest.mark.parametrize("i", range(6))
def test_fine(i, record):
    record.add(states_checked=i + 1)

def test_dies():
    os._exit(3)
''')
    _subprocess_env(monkeypatch)
    run_dir = tmp_path / "run"
    result = pytester.runpytest_subprocess(str(path), "-p", "xdist.plugin", "-n", "2", "-p", "harness.plugin",
                                           "--results-dir",
                                           str(run_dir), "--leg", "xdist-leg", "-p", "no:cacheprovider",
                                           timeout=120)
    result.stdout.fnmatch_lines(["*crashed*test_dies*"])
    records = _records(run_dir)
    dead = records["test_dies"]
    assert dead.outcome == "crashed" and "crashed" in dead.message and dead.leg == "xdist-leg"
    fine = {case: r for case, r in records.items() if case.startswith("test_fine")}
    assert len(fine) == 6 and all(r.outcome == "passed" for r in fine.values())
    assert sorted(r.metrics["states_checked"] for r in fine.values()) == [1, 2, 3, 4, 5, 6]
    assert all(r.worker and r.worker.startswith("gw") for r in fine.values())
    assert _manifest(run_dir)["complete"] is True


def test_a_reused_results_directory_holds_only_the_last_runs_records(pytester, tmp_path, monkeypatch):
    """Twice into one directory, the second time over two xdist workers: every case once."""
    pytest.importorskip("xdist")
    path = pytester.makepyfile(test_twice='''
import pytest


@pytest.mark.parametrize("i", range(6))
def test_case(i, record):
    record.add(states_checked=i + 1)
''')
    _subprocess_env(monkeypatch)
    run_dir = tmp_path / "run"
    common = ["-p", "harness.plugin", "--results-dir", str(run_dir), "-p", "no:cacheprovider"]
    pytester.runpytest_subprocess(str(path), *common, timeout=120).assert_outcomes(passed=6)
    result = pytester.runpytest_subprocess(str(path), "-p", "xdist.plugin", "-n", "2", *common, timeout=120)
    result.assert_outcomes(passed=6)
    records = read_records(run_dir / RECORDS_FILE)
    assert records.problems == []
    assert sorted(r.metrics["states_checked"] for r in records.records) == [1, 2, 3, 4, 5, 6]
    assert all(r.worker and r.worker.startswith("gw") for r in records.records)


def test_a_run_that_collects_no_test_is_complete(pytester, tmp_path):
    pytester.makepyfile(test_inner=INNER)
    run_dir = tmp_path / "run"
    result = pytester.runpytest("-p", "harness.plugin", "--results-dir", str(run_dir), "-k", "no_such_case",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    manifest = _manifest(run_dir)
    assert manifest["complete"] is True and manifest["exitstatus"] == 5
    assert _records(run_dir) == {}


def test_benchmark_cases_print_a_progress_line_as_they_land(pytester, tmp_path):
    pytester.makeini("[pytest]\nmarkers =\n    bench: a benchmark\n")
    pytester.makepyfile(test_bench_inner='''
import pytest

pytestmark = pytest.mark.bench

@pytest.mark.parametrize("shape", ["small", "large"])
def test_timed(record, shape):
    record.add(ms=1.25 if shape == "small" else 2.5, pct_of_peak=40.0)
''')
    result = pytester.runpytest("-p", "harness.plugin", "--results-dir", str(tmp_path / "run"),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    output = result.stdout.str() + result.stderr.str()
    assert "[1/2] bench: bench_inner::test_timed[small] ... 1.25 ms  (40.0% of copy)" in output
    assert "[2/2] bench: bench_inner::test_timed[large] ... 2.5 ms  (40.0% of copy)" in output


@pytest.mark.parametrize(("environ", "cpus", "expected"), [
    ({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "8"}, 16, 2),
    ({"PYTEST_XDIST_WORKER": "gw3", "PYTEST_XDIST_WORKER_COUNT": "16"}, 32, 2),
    ({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "4"}, 2, 1),
    ({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, 16, None),
    ({}, 16, None),
])
def test_worker_cpu_threads_share_the_cores(environ, cpus, expected):
    from harness.plugin import worker_cpu_threads

    assert worker_cpu_threads(environ, cpus) == expected


def test_xdist_workers_share_the_cores(pytester, monkeypatch):
    pytest.importorskip("xdist")
    _subprocess_env(monkeypatch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pytester.makepyfile(test_threads='''
import os, torch
def test_threads():
    count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) // count)
''')
    result = pytester.runpytest_subprocess("-p", "xdist.plugin", "-n", "2", "-p", "harness.plugin",
                                           "--results-dir", str(pytester.path / "run"), "-p", "no:cacheprovider",
                                           timeout=120)
    result.assert_outcomes(passed=1)


def test_one_gc_pass_ends_a_pytest_process_on_cpython(pytestconfig):
    unraisable = pytest.importorskip("_pytest.unraisableexception")
    key = getattr(unraisable, "gc_collect_iterations_key", None)
    if key is None:
        pytest.skip("this pytest has no gc_collect_iterations_key")
    import sys

    expected = 1 if sys.implementation.name == "cpython" else 5
    assert pytestconfig.stash.get(key, 5) == expected


def test_a_gc_pass_count_set_before_is_kept():
    from types import SimpleNamespace

    from _pytest.stash import Stash

    from harness.plugin import _one_gc_pass_at_exit

    key = pytest.importorskip("_pytest.unraisableexception").gc_collect_iterations_key
    config = SimpleNamespace(stash=Stash())
    config.stash[key] = 0
    _one_gc_pass_at_exit(config)
    assert config.stash[key] == 0
