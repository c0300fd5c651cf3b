"""The compute-sanitizer runner without a GPU: parsing the tools' output, the command lines,
finding the executable, judging runs, and the records and report it writes."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from processes import SigintWhen, ended

from harness.checks import sanitize
from harness.records import RECORDS_FILE, read_records
from harness.report.cli import main as report_main

MEMCHECK_CLEAN = """\
========= COMPUTE-SANITIZER
driver packing-triton: ok
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_DIRTY = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at _pack_bytes_kernel+0x1c0 in /work/kvbits/packing.py:95
=========     by thread (31,0,0) in block (3,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
========= Invalid __global__ write of size 4 bytes
=========     at _pack_bytes_kernel+0x1c0 in /work/kvbits/packing.py:95
========= Target application returned an error
========= ERROR SUMMARY: 2 errors
"""

RACECHECK_DIRTY = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at tiled_kernel+0x90
=========     and Read access at tiled_kernel+0x120 [128 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

RACECHECK_CLEAN = ("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 2 warnings)\n")

INITCHECK_DIRTY = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at _decode_merge_kernel+0x2b0
========= ERROR SUMMARY: 7 errors
"""


@pytest.mark.parametrize(("text", "errors", "warnings", "first"), [
    (MEMCHECK_CLEAN, 0, 0, None),
    (MEMCHECK_DIRTY, 2, 0, "Invalid __global__ write of size 4 bytes"),
    (RACECHECK_DIRTY, 1, 0, "Error: Race reported between Write access at tiled_kernel+0x90"),
    (RACECHECK_CLEAN, 0, 2, None),
    (INITCHECK_DIRTY, 7, 0, "Uninitialized __global__ memory read of size 4 bytes"),
    ("Traceback (most recent call last):\nRuntimeError: CUDA driver error\n", None, 0, None),
], ids=["memcheck-clean", "memcheck-errors", "racecheck-errors", "racecheck-warnings", "initcheck", "no-summary"])
def test_parse_output(text, errors, warnings, first):
    summary = sanitize.parse_output(text)
    assert (summary.errors, summary.warnings, summary.first) == (errors, warnings, first)


@pytest.mark.parametrize(("rc", "text", "outcome", "errors"), [
    (0, MEMCHECK_CLEAN, "passed", 0),
    (0, RACECHECK_CLEAN, "passed", 0),
    (1, MEMCHECK_DIRTY, "failed", 2),
    (0, INITCHECK_DIRTY, "failed", 7),
    (1, "========= ERROR SUMMARY: 0 errors\nAssertionError: 3 elements differ\n", "error", 0),
    (134, "Aborted (core dumped)\n", "error", None),
    (None, "", "timeout", None),
])
def test_judge(rc, text, outcome, errors):
    check = sanitize.judge("memcheck", "int8-tiled", rc, text, 12.0)
    assert (check.outcome, check.errors) == (outcome, errors)
    if outcome == "failed":
        assert check.detail
    record = check.record()
    assert record.suite == "sanitize" and record.case == "memcheck:int8-tiled" and record.outcome == outcome
    assert record.metrics["errors"] == (-1 if errors is None else errors) and record.backend == "cuda"


def test_command_lines_and_environment(monkeypatch):
    cmd = sanitize.sanitizer_command("/opt/cs", "racecheck", "decode-triton", python="/py")
    assert cmd[:3] == ["/opt/cs", "--tool", "racecheck"]
    assert cmd[-5:] == ["/py", "-m", "harness.checks.sanitize", "--run-kernel", "decode-triton"]
    assert "--racecheck-report" in cmd
    assert "--leak-check" in sanitize.sanitizer_command("/opt/cs", "memcheck", "packing-cuda", python="/py")
    with pytest.raises(ValueError, match="tool must be one of"):
        sanitize.sanitizer_command("/opt/cs", "synccheck-typo", "decode-triton")
    with pytest.raises(ValueError, match="kernel must be one of"):
        sanitize.sanitizer_command("/opt/cs", "memcheck", "no-such-kernel")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = sanitize.sanitizer_env()
    assert env["TRITON_INTERPRET"] == "0", "the sanitizer must see compiled kernels"
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1", "one allocation per tensor, or overruns stay hidden"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(sanitize.ROOT), "/elsewhere"]


def test_every_gpu_kernel_has_a_driver():
    names = set(sanitize.KERNELS)
    assert {"packing-triton", "packing-cuda", "int8-triton", "affine-triton", "decode-triton"} <= names
    assert {f"int8-{v}" for v in ("naive", "tiled", "coarsened", "vectorized")} <= names


def _executable(path):
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_find_sanitizer(tmp_path):
    tool = _executable(tmp_path / "compute-sanitizer")
    assert sanitize.find_sanitizer({"COMPUTE_SANITIZER": tool, "PATH": ""}) == tool
    assert sanitize.find_sanitizer({"COMPUTE_SANITIZER": str(tmp_path / "missing"), "PATH": ""}) is None
    assert sanitize.find_sanitizer({"PATH": str(tmp_path)}) == tool
    found = sanitize.find_sanitizer({"PATH": str(tmp_path / "empty")})
    assert found is None or found.startswith("/usr/local/cuda")


def _fake_runner(outputs: dict, calls: list):
    def run(cmd, env, timeout_s):
        calls.append(cmd)
        kernel = cmd[-1]
        tool = cmd[cmd.index("--tool") + 1] if "--tool" in cmd else "plain"
        rc, text = outputs.get((tool, kernel), (0, MEMCHECK_CLEAN if tool != "plain" else "driver ok\n"))
        return rc, text, 1.5
    return run


def test_run_checks_records_and_report(tmp_path):
    calls: list = []
    outputs = {
        ("plain", "int8-tiled"): (1, "Traceback\nAssertionError: int8 tiled codes differ\n"),
        ("racecheck", "decode-triton"): (0, RACECHECK_DIRTY),
        ("racecheck", "packing-cuda"): (0, RACECHECK_CLEAN),
    }
    checks = sanitize.run_checks(["memcheck", "racecheck"], ["packing-cuda", "int8-tiled", "decode-triton"],
                                 sanitizer="/opt/cs", runner=_fake_runner(outputs, calls), progress=lambda s: None)
    got = {(c.tool, c.kernel): c.outcome for c in checks}
    assert got == {
        ("memcheck", "packing-cuda"): "passed", ("racecheck", "packing-cuda"): "passed",
        ("memcheck", "int8-tiled"): "error", ("racecheck", "int8-tiled"): "error",
        ("memcheck", "decode-triton"): "passed", ("racecheck", "decode-triton"): "failed",
    }
    assert sum("--tool" in c for c in calls) == 4, "a driver that fails plainly is not run under the tools"
    broken = next(c for c in checks if c.kernel == "int8-tiled")
    assert "fails without the sanitizer" in broken.detail and "int8 tiled codes differ" in broken.detail
    text = sanitize.table(checks, ["memcheck", "racecheck"])
    assert "1 errors" in text and "ERROR" in text and "3/6 checks clean" in text

    from harness.run.streamed_run import write_run

    run_dir = tmp_path / "sanitize"
    write_run(run_dir, [c.record() for c in checks], kind="sanitize", leg="leg-s", args=[], started="t0")
    records = {r.case: r for r in read_records(run_dir / RECORDS_FILE).records}
    assert records["racecheck:decode-triton"].metrics["errors"] == 1
    assert records["racecheck:decode-triton"].message.startswith("Error: Race reported")
    html = tmp_path / "report.html"
    assert report_main(["report", str(run_dir), "-o", str(html)]) == 0
    page = html.read_text(encoding="utf-8")
    assert "racecheck:decode-triton" in page and "memcheck:int8-tiled" in page


def test_jobs_check_kernels_at_once_and_keep_the_order(tmp_path):
    """--jobs N runs N kernels' checks side by side; the checks come back in the serial order."""
    outputs = {("racecheck", "decode-triton"): (0, RACECHECK_DIRTY)}
    kernels = ["packing-cuda", "int8-tiled", "decode-triton", "affine-triton"]
    serial = sanitize.run_checks(["memcheck", "racecheck"], kernels, sanitizer="/opt/cs",
                                 runner=_fake_runner(outputs, []), progress=lambda s: None)
    running, peak, lock = [0], [0], threading.Lock()
    inner = _fake_runner(outputs, [])

    def slow_runner(cmd, env, timeout_s):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return inner(cmd, env, timeout_s)

    seen = []
    parallel = sanitize.run_checks(["memcheck", "racecheck"], kernels, sanitizer="/opt/cs", runner=slow_runner,
                                   progress=lambda s: None, on_check=seen.append, jobs=3)
    assert [(c.tool, c.kernel, c.outcome) for c in parallel] == [(c.tool, c.kernel, c.outcome) for c in serial]
    assert sorted((c.tool, c.kernel) for c in seen) == sorted((c.tool, c.kernel) for c in serial)
    assert 2 <= peak[0] <= 3, peak  # side by side, never more than --jobs
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        sanitize.run_checks(["memcheck"], kernels, sanitizer="/opt/cs", runner=inner, jobs=0)
    with pytest.raises(SystemExit):
        sanitize.build_parser().parse_args(["--jobs", "0"])


def test_an_interrupt_starts_no_further_tool(tmp_path):
    """Ctrl-C (or a command limit's SIGINT) in the middle of a parallel run: the kernels still
    running start no further tool, and the interrupt reaches the caller."""
    calls: list = []
    inner = _fake_runner({}, calls)

    def runner(cmd, env, timeout_s):
        if "--tool" in cmd and cmd[-1] == "decode-triton":
            raise KeyboardInterrupt
        time.sleep(0.05)
        return inner(cmd, env, timeout_s)

    with pytest.raises(KeyboardInterrupt):
        sanitize.run_checks(["memcheck", "racecheck", "initcheck"], ["decode-triton", "packing-cuda"],
                            sanitizer="/opt/cs", runner=runner, progress=lambda s: None, jobs=2)
    time.sleep(0.5)  # what a running kernel would still do after the interrupt
    tools_on_packing = [c for c in calls if "--tool" in c and c[-1] == "packing-cuda"]
    assert len(tools_on_packing) < 3, "a running kernel went on through every tool after the interrupt"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_3(capsys, tmp_path):
    assert sanitize.main(["--results-dir", str(tmp_path / "run")]) == sanitize.NOT_RUNNABLE_EXIT
    err = capsys.readouterr().err
    assert "NOT RUN" in err and "no CUDA device" in err
    assert not (tmp_path / "run").exists()
    assert sanitize.main(["--list"]) == 0
    assert sanitize.run_kernel("packing-triton") == sanitize.NOT_RUNNABLE_EXIT


def test_missing_sanitizer_is_named(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    reason = sanitize.unavailable_reason(None)
    assert "compute-sanitizer not found" in reason and "COMPUTE_SANITIZER" in reason
    assert sanitize.unavailable_reason(sys.executable) is None


def test_a_run_cut_short_keeps_every_finished_check(tmp_path):
    """Each check lands in the run directory as it ends: a run killed midway (a command limit)
    leaves those records and a manifest the report shows as incomplete."""
    from harness.run.streamed_run import StreamedRun

    calls: list = []
    inner = _fake_runner({}, calls)

    def runner(cmd, env, timeout_s):
        if "--tool" in cmd and cmd[-1] == "decode-triton":
            raise KeyboardInterrupt  # what the command limit's SIGINT does mid-run
        return inner(cmd, env, timeout_s)

    run_dir = tmp_path / "cut"
    run = StreamedRun(run_dir, kind="sanitize", leg="leg-s", args=[])
    with pytest.raises(KeyboardInterrupt):
        sanitize.run_checks(["memcheck", "initcheck"], ["packing-cuda", "decode-triton"], sanitizer="/opt/cs",
                            runner=runner, progress=lambda s: None, on_check=lambda c: run.add(c.record()))
    records = {r.case: r.outcome for r in read_records(run_dir / RECORDS_FILE).records}
    assert records == {"memcheck:packing-cuda": "passed", "initcheck:packing-cuda": "passed"}
    html = tmp_path / "report.html"
    assert report_main(["report", str(run_dir), "-o", str(html)]) == 0
    page = html.read_text(encoding="utf-8")
    assert "incomplete run" in page and "initcheck:packing-cuda" in page


def _script(path: Path, text: str) -> str:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs POSIX signals and /proc")
@pytest.mark.parametrize("jobs", [1, 3])
def test_a_real_interrupt_kills_every_running_child_and_keeps_the_finished_checks(tmp_path, jobs):
    """A SIGINT to the process while kernels' drivers run (one in the main thread, or several in
    worker threads): each running driver's whole group is gone at once, the interrupt reaches the
    caller promptly, and the check that finished before it stays in the records."""
    from harness.run.streamed_run import StreamedRun

    pids = tmp_path / "pids"
    pids.mkdir()
    python = _script(tmp_path / "python", (  # the driver: int8-naive passes, the others hang with a grandchild
        'for kernel; do :; done\n'
        '[ "$kernel" = int8-naive ] && exit 0\n'
        f'sleep 60 & echo "$$ $!" > {pids}/$kernel\nwait\n'))
    sanitizer = _script(tmp_path / "compute-sanitizer", "echo '========= ERROR SUMMARY: 0 errors'\n")
    run = StreamedRun(tmp_path / "run", kind="sanitize", leg="leg-s", args=[])
    seen: list = []

    def ready() -> bool:
        return len(seen) == 1 and len(list(pids.iterdir())) == min(jobs, 2)

    with SigintWhen(ready) as interrupt, pytest.raises(KeyboardInterrupt):
        sanitize.run_checks(["memcheck"], ["int8-naive", "int8-tiled", "decode-triton"], sanitizer=sanitizer,
                            python=python, timeout_s=120, progress=lambda s: None, jobs=jobs,
                            on_check=lambda c: (run.add(c.record()), seen.append(c)))
    assert interrupt.sent_at is not None and time.monotonic() - interrupt.sent_at < 10
    for marker in pids.iterdir():
        assert all(ended(int(pid)) for pid in marker.read_text().split()), marker.name
    records = [(r.case, r.outcome) for r in read_records(tmp_path / "run" / RECORDS_FILE).records]
    assert records == [("memcheck:int8-naive", "passed")]


def test_a_driver_timeout_is_a_timeout(tmp_path):
    """A driver that times out without the sanitizer makes each of its checks a timeout, not an error."""
    checks = sanitize.run_checks(["memcheck", "racecheck"], ["int8-naive"], sanitizer="/opt/cs",
                                 runner=lambda cmd, env, timeout_s: (None, "partial output", timeout_s),
                                 timeout_s=5, progress=lambda s: None)
    assert [(c.tool, c.outcome) for c in checks] == [("memcheck", "timeout"), ("racecheck", "timeout")]
    assert all(c.record().outcome == "timeout" and "timed out" in c.detail for c in checks)


def test_a_command_that_cannot_start_is_an_error_check(tmp_path):
    """A sanitizer path that is not there fails its checks (exit 127 and the reason), not the run;
    the command line refuses one at once."""
    seen: list = []
    checks = sanitize.run_checks(["memcheck"], ["int8-naive", "int8-tiled"], sanitizer=str(tmp_path / "missing"),
                                 python=_script(tmp_path / "python", "exit 0\n"), timeout_s=30,
                                 progress=lambda s: None, on_check=seen.append)
    assert [c.outcome for c in checks] == ["error", "error"] and seen == checks
    assert "exit 127" in checks[0].detail and "cannot run" in checks[0].detail
    with pytest.raises(SystemExit):
        sanitize.build_parser().parse_args(["--sanitizer", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        sanitize.build_parser().parse_args(["--sanitizer", str(tmp_path)])  # a directory


def test_a_sanitizer_named_as_on_path_is_found(tmp_path, monkeypatch):
    tool = _script(tmp_path / "compute-sanitizer", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    args = sanitize.build_parser().parse_args(["--sanitizer", "compute-sanitizer"])
    assert args.sanitizer == str(tool)


@pytest.mark.parametrize("option", [["--timeout", "0"], ["--timeout", "-5"], ["--jobs", "0"]])
def test_limits_must_be_positive(option):
    with pytest.raises(SystemExit):
        sanitize.build_parser().parse_args(option)


def test_a_results_dir_that_is_a_file_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sanitize, "unavailable_reason", lambda sanitizer: None)
    taken = tmp_path / "taken"
    taken.write_text("")
    code = sanitize.main(["--results-dir", str(taken), "--sanitizer", _script(tmp_path / "cs", "exit 0\n")])
    assert code == 2 and "cannot write the run directory" in capsys.readouterr().err
