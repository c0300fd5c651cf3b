"""Benchmark progress lines: ``[i/n] name ... ms``, flushed, and visible through pytest capture."""

from __future__ import annotations

import io

import pytest

from harness.measure.progress import BenchProgress


class FlushCounter(io.StringIO):
    flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


def test_report_and_step_lines():
    stream = FlushCounter()
    progress = BenchProgress(12, label="decode", stream=stream)
    assert (progress.report("S=4096 splitk", 0.61234, "2.4 TB/s")
            == "[ 1/12] decode: S=4096 splitk ... 0.6123 ms  (2.4 TB/s)")
    with progress.step("S=8192 dot") as step:
        step.ms = 1.5
    with progress.step("timed by wall clock"):
        pass
    lines = stream.getvalue().splitlines()
    assert lines[1] == "[ 2/12] decode: S=8192 dot ... 1.5 ms"
    assert lines[2].startswith("[ 3/12] decode: timed by wall clock ... ") and lines[2].endswith(" ms")
    assert stream.flushes == 3 and progress.lines == lines


def test_failed_step_prints_and_reraises():
    stream = io.StringIO()
    progress = BenchProgress(1, stream=stream)
    with pytest.raises(RuntimeError), progress.step("oom"):
        raise RuntimeError("out of memory")
    assert stream.getvalue() == "[1/1] oom ... failed  (raised)\n"


@pytest.mark.parametrize("total", [-1, 2.0, True, "3"])
def test_total_must_be_a_count(total):
    with pytest.raises(ValueError, match="total must be a non-negative int"):
        BenchProgress(total)


def test_lines_show_live_through_pytest_capture(pytester):
    pytester.makepyfile(test_bench='''
from harness.measure.progress import BenchProgress

def test_many_shapes(request):
    progress = BenchProgress(2, label="int8", config=request.config)
    for name in ("naive", "fused"):
        progress.report(name, 1.25)
''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stderr.fnmatch_lines(["[1/2] int8: naive ... 1.25 ms", "[2/2] int8: fused ... 1.25 ms"])
