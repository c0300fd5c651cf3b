"""No fault loses results: crashes, timeouts and a killed run, each on a tiny inner suite.

Each case runs pytest in a child process on a small test file written for it, with the
recording plugin, then reads what the run left: records, manifest, and the rendered
report. A crash in an xdist worker (os.abort, a segfault, on a GPU an illegal address)
must cost only the test that crashed; a per-test timeout must end as a ``timeout``
record; a run killed from outside must leave every finished record readable and a
report that says the run is incomplete.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.records import MANIFEST_FILE, RECORDS_FILE, read_records
from harness.report.cli import main as report_main

ROOT = Path(__file__).resolve().parents[1]

HAS_XDIST = importlib.util.find_spec("xdist") is not None
HAS_TIMEOUT = importlib.util.find_spec("pytest_timeout") is not None
needs_xdist = pytest.mark.skipif(not HAS_XDIST, reason="needs pytest-xdist")
needs_timeout = pytest.mark.skipif(not HAS_TIMEOUT, reason="needs pytest-timeout (pip install pytest-timeout)")

FINE = '''
import pytest

@pytest.mark.parametrize("i", range(4))
def test_fine(i, record):
    record.backend = "torch"
    record.add(states_checked=i + 1, max_abs_err=0.0)
'''


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "KVH_RESULTS_DIR")}
    env.update(PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONFAULTHANDLER="0")
    return env


def _argv(test_file: Path, run_dir: Path, *extra: str) -> list[str]:
    plugins = []
    if "-n" in extra:
        plugins += ["-p", "xdist.plugin"]
    if any(a.startswith("--timeout") for a in extra):
        plugins += ["-p", "pytest_timeout"]
    return [sys.executable, "-m", "pytest", str(test_file), "-p", "harness.plugin", *plugins,
            "-p", "no:cacheprovider", "--results-dir", str(run_dir), "--leg", "inner", "-q", *extra]


def _run(tmp_path: Path, source: str, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, Path]:
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(source)
    run_dir = tmp_path / "run"
    proc = subprocess.run(_argv(test_file, run_dir, *extra), cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    return proc, run_dir


def _records(run_dir: Path, problems: int = 0) -> dict:
    result = read_records(run_dir / RECORDS_FILE)
    assert len(result.problems) == problems, result.problems
    return {r.case: r for r in result.records}


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / MANIFEST_FILE).read_text())


def _render(run_dir: Path, tmp_path: Path) -> str:
    html = tmp_path / "report.html"
    assert report_main(["report", str(run_dir), "-o", str(html)]) == 0
    return html.read_text(encoding="utf-8")


def _assert_fine_intact(records: dict) -> None:
    fine = {case: r for case, r in records.items() if case.startswith("test_fine")}
    assert len(fine) == 4 and all(r.outcome == "passed" for r in fine.values()), fine
    assert sorted(r.metrics["states_checked"] for r in fine.values()) == [1, 2, 3, 4]


@needs_xdist
def test_abort_and_segfault_in_workers_cost_only_their_tests(tmp_path):
    source = FINE + '''
import ctypes
import os

def test_abort():
    os.abort()

def test_segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV

def test_after(record):
    record.add(states_checked=7)
'''
    proc, run_dir = _run(tmp_path, source, "-n", "2")
    assert proc.returncode == 1, proc.stdout[-2000:]
    records = _records(run_dir)
    assert set(records) == {*(f"test_fine[{i}]" for i in range(4)), "test_abort", "test_segfault", "test_after"}
    for case in ("test_abort", "test_segfault"):
        assert records[case].outcome == "crashed", (case, records[case].outcome)
        assert "crashed" in records[case].message
    assert records["test_after"].outcome == "passed" and records["test_after"].metrics == {"states_checked": 7}
    _assert_fine_intact(records)
    manifest = _manifest(run_dir)
    assert manifest["complete"] is True and manifest["counts"] == {"passed": 5, "crashed": 2}
    html = _render(run_dir, tmp_path)
    assert "test_abort" in html and "test_segfault" in html and "crashed" in html
    assert "test_fine[3]" in html


@needs_timeout
def test_per_test_timeout_ends_as_a_timeout_record(tmp_path):
    source = FINE + '''
import time

def test_hangs():
    time.sleep(60)

def test_after(record):
    record.add(states_checked=7)
'''
    start = time.monotonic()
    proc, run_dir = _run(tmp_path, source, "--timeout", "2")
    assert time.monotonic() - start < 45, "the timeout did not stop the hanging test"
    assert proc.returncode == 1, proc.stdout[-2000:]
    records = _records(run_dir)
    assert records["test_hangs"].outcome == "timeout"
    assert "Timeout" in records["test_hangs"].message
    assert records["test_after"].outcome == "passed"
    _assert_fine_intact(records)
    assert _manifest(run_dir)["complete"] is True
    assert "timeout" in _render(run_dir, tmp_path)


@needs_xdist
@needs_timeout
def test_thread_timeout_in_a_worker_ends_as_a_timeout_record(tmp_path):
    """gpu_verify runs xdist workers with ``--timeout-method thread``: pytest-timeout then ends
    the worker process, and the plugin must still tell a timeout from a crash."""
    source = FINE + '''
import time

def test_hangs():
    time.sleep(60)
'''
    proc, run_dir = _run(tmp_path, source, "-n", "1", "--timeout", "3", "--timeout-method", "thread")
    records = _records(run_dir)
    _assert_fine_intact(records)
    assert records["test_hangs"].outcome == "timeout", records["test_hangs"].message


def _wait_for_records(path: Path, n: int, proc: subprocess.Popen, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the inner run ended early (exit {proc.returncode}): {proc.stdout.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{n} records did not appear within {limit_s} s")


@needs_xdist
def test_run_killed_mid_way_leaves_readable_records_and_an_incomplete_report(tmp_path):
    """SIGKILL to the whole run (controller and workers) after the first records: every
    finished record stays readable, the manifest says incomplete, the report says so."""
    source = FINE + '''
import time

def test_blocks():
    time.sleep(120)
'''
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(source)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_argv(test_file, run_dir, "-n", "2"), cwd=tmp_path, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_records(run_dir / RECORDS_FILE, 4, proc)
        time.sleep(0.3)  # let the last fsync'd line settle before the kill
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    records = _records(run_dir)
    _assert_fine_intact(records)
    assert "test_blocks" not in records
    manifest = _manifest(run_dir)
    assert manifest["complete"] is False and manifest["finished"] is None
    html = _render(run_dir, tmp_path)
    assert "incomplete run" in html and "did not finish" in html
    assert "test_fine[0]" in html

    # A write torn by the kill (a partial last line) is reported, never fatal.
    with open(run_dir / RECORDS_FILE, "ab") as fh:
        fh.write(b'{"schema": 1, "suite": "inner", "case": "test_bl')
    records = _records(run_dir, problems=1)
    _assert_fine_intact(records)
    html = _render(run_dir, tmp_path)
    assert "truncated" in html and "incomplete run" in html


GPU_FAULT = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _store_far_out_of_bounds(ptr):
    tl.store(ptr + (1 << 40), 1.0)  # 4 TiB past a 16-byte buffer: an illegal address


def test_before(record):
    record.add(states_checked=int(torch.ones(4, device="cuda").sum().item()))


def test_illegal_address():
    x = torch.zeros(4, device="cuda")
    _store_far_out_of_bounds[(1,)](x)
    torch.cuda.synchronize()


def test_after(record):
    record.add(states_checked=int(torch.ones(4, device="cuda").sum().item()))
'''


@needs_xdist
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_illegal_address_costs_only_its_test(tmp_path):
    """An out-of-bounds Triton store kills the worker's CUDA context; the worker must end (a
    ``crashed`` record) and its replacement must run the next test on a fresh context."""
    proc, run_dir = _run(tmp_path, GPU_FAULT, "-n", "1", timeout=300)
    records = _records(run_dir)
    assert records["test_before"].outcome == "passed"
    assert records["test_illegal_address"].outcome == "crashed", records["test_illegal_address"].message
    assert records["test_after"].outcome == "passed", records["test_after"].message
    assert records["test_after"].metrics == {"states_checked": 4}
    assert "crashed" in _render(run_dir, tmp_path)
