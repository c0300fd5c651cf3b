"""harness.measure.timeline: process start times, the marks of one process, the manifest's timeline and
its one-line description; and the plugin filling it in for a serial and an xdist run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.measure import timeline
from harness.records import MANIFEST_FILE

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_start_time_of_this_process_and_of_a_child():
    mine = timeline.process_start_time()
    assert mine is not None and mine <= time.time()
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    try:
        started = timeline.process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert started is not None
    assert before - 1.0 <= started <= time.time() + 0.01  # clock ticks: 10 ms resolution
    assert mine <= started


def test_process_start_time_of_no_process_is_none():
    assert timeline.process_start_time(2**31 - 1) is None


def test_marks_keep_the_first_or_the_last_moment():
    marks = timeline.Marks(started=100.0)
    marks.first("first_test", 105.0)
    marks.first("first_test", 104.0)
    marks.last("last_test_end", 106.0)
    marks.last("last_test_end", 109.0)
    assert marks.times == {"started": 100.0, "first_test": 105.0, "last_test_end": 109.0}


def _example() -> dict:
    controller = {"started": 1000.0, "configured": 1003.0, "first_test": 1007.9, "last_test_end": 1019.1,
                  "finished": 1020.3}
    workers = {
        "gw1": {"started": 1003.2, "configured": 1006.0, "collected": 1007.5, "first_test": 1007.9,
                "last_test_end": 1019.1, "finished": 1019.2},
        "gw0": {"started": 1003.1, "configured": 1005.0, "collected": 1006.0, "first_test": 1008.5,
                "last_test_end": 1018.0, "finished": 1018.1},
    }
    return timeline.build(controller, workers)


def test_build_makes_every_mark_relative_to_the_controller_start():
    built = _example()
    assert built["origin"] == 1000.0
    assert list(built["workers"]) == ["gw0", "gw1"]
    assert built["controller"] == {"started": 0.0, "configured": 3.0, "first_test": 7.9, "last_test_end": 19.1,
                                   "finished": 20.3}
    assert built["workers"]["gw1"]["collected"] == 7.5
    assert json.loads(json.dumps(built)) == built


def test_build_without_a_controller_start_uses_the_earliest_mark():
    built = timeline.build({"first_test": 50.0, "finished": 60.0}, {"gw0": {"started": 40.0, "first_test": 50.0}})
    assert built["origin"] == 40.0 and built["workers"]["gw0"]["started"] == 0.0


def test_phases_and_the_description():
    phases = timeline.phases(_example())
    assert phases["startup"] == pytest.approx(7.9)
    assert phases["tests"] == pytest.approx(11.2)
    assert phases["collected"] == pytest.approx(7.5)
    assert phases["ready_median"] == pytest.approx(8.2) and phases["ready_max"] == pytest.approx(8.5)
    assert phases["wind_down"] == pytest.approx(1.2) and phases["total"] == pytest.approx(20.3)
    assert timeline.describe(_example()) == (
        "first test at 7.9 s (2 workers ready 8.2 s median, 8.5 s last; collected by 7.5 s) \N{MIDDLE DOT} "
        "tests 11.2 s \N{MIDDLE DOT} wind-down 1.2 s \N{MIDDLE DOT} session ended at 20.3 s")


def test_a_serial_run_without_workers_or_an_end():
    built = timeline.build({"started": 0.0, "collected": 2.0, "first_test": 2.5, "last_test_end": 3.0}, {})
    assert timeline.describe(built) == "first test at 2.5 s (collected by 2.0 s) \N{MIDDLE DOT} tests 0.5 s"


def test_workers_that_ran_no_test_are_not_counted_ready_and_non_finite_marks_are_ignored():
    built = timeline.build({"started": 0.0, "first_test": 5.0, "last_test_end": 6.0, "finished": float("nan")},
                           {"gw0": {"started": 1.0, "first_test": 5.0}, "gw1": {"started": 1.0}})
    phases = timeline.phases(built)
    assert phases["workers"] == 1 and "total" not in phases
    assert "nan" not in timeline.describe(built) and "1 worker ready" in timeline.describe(built)


@pytest.mark.parametrize("bad", [None, {}, [], "text", {"controller": "x", "workers": []},
                                 {"controller": {"first_test": True, "last_test_end": 3}},
                                 {"controller": {"started": 0.0}, "workers": {"gw0": {"started": 1.0}}}])
def test_no_usable_timeline_describes_as_none(bad):
    assert timeline.phases(bad) is None
    assert timeline.describe(bad) is None


def _run(pytester, monkeypatch, *args):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(test_inner='''
import pytest

@pytest.mark.parametrize("i", range(4))
def test_case(i, record):
    record.add(states_checked=i + 1)
''')
    run_dir = pytester.path / "run"
    result = pytester.runpytest_subprocess(*args, "-p", "harness.plugin", "--results-dir", str(run_dir),
                                           "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=4)
    return json.loads((run_dir / MANIFEST_FILE).read_text())["timeline"]


def _in_order(marks: dict) -> None:
    present = [marks[name] for name in timeline.MARKS if name in marks]
    assert present == sorted(present), marks


def test_a_serial_run_records_the_controller_marks(pytester, monkeypatch):
    recorded = _run(pytester, monkeypatch)
    assert recorded["workers"] == {}
    assert set(recorded["controller"]) >= {"configured", "collected", "first_test", "last_test_end", "finished"}
    _in_order(recorded["controller"])


def test_an_xdist_run_records_every_worker(pytester, monkeypatch):
    pytest.importorskip("xdist")
    recorded = _run(pytester, monkeypatch, "-p", "xdist.plugin", "-n", "2")
    assert sorted(recorded["workers"]) == ["gw0", "gw1"]
    for marks in recorded["workers"].values():
        assert set(marks) >= {"configured", "collected", "finished"}
        _in_order(marks)
    phases = timeline.phases(recorded)
    assert phases["workers"] == 2 and phases["tests"] >= 0 and phases["wind_down"] >= 0


def test_the_pipeline_says_where_a_step_s_time_went(tmp_path, capsys):
    from harness.run import pipeline

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pipeline._say_timeline("suites", str(run_dir))  # no manifest: nothing to say
    (run_dir / MANIFEST_FILE).write_text("[1, 2]")
    pipeline._say_timeline("suites", str(run_dir))  # not a manifest: nothing either
    assert capsys.readouterr().out == ""
    (run_dir / MANIFEST_FILE).write_text(json.dumps({"timeline": _example()}))
    pipeline._say_timeline("suites", str(run_dir))
    assert capsys.readouterr().out == f"[kvh] suites: {timeline.describe(_example())}\n"


@pytest.mark.parametrize(("counts", "expected"), [
    ({"stored": 281, "loaded_after_wait": 5}, "281 compiled, 5 waited for in another worker"),
    ({"stored": 0, "loaded_after_wait": 0}, "0 compiled, 0 waited for in another worker"),
    ({"stored": 3}, None), ({"stored": True, "loaded_after_wait": 1}, None), (None, None), ([1, 2], None),
])
def test_describe_compiles(counts, expected):
    assert timeline.describe_compiles(counts) == expected
