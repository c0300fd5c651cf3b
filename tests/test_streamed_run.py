"""Run directories written as results arrive (mutants, sanitizer): readable at every moment."""

from __future__ import annotations

import json
import threading

import pytest

from harness.records import MANIFEST_FILE, RECORDS_FILE, Record, read_records
from harness.run.streamed_run import StreamedRun


def _record(i: int, outcome: str = "passed") -> Record:
    return Record(suite="mutants", group="harness", case=f"m{i}", nodeid=f"harness/mutants::m{i}",
                  outcome=outcome, duration_s=0.1)


def test_records_and_counts_land_as_they_arrive_and_finish_completes(tmp_path):
    run = StreamedRun(tmp_path / "run", kind="mutants", leg="leg-x", args=["--ci"])
    manifest = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    assert manifest["complete"] is False and manifest["finished"] is None and manifest["kind"] == "mutants"
    run.add(_record(0))
    run.add(_record(1, "failed"))
    manifest = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    assert manifest["counts"] == {"passed": 1, "failed": 1} and manifest["complete"] is False
    records = read_records(tmp_path / "run" / RECORDS_FILE).records
    assert [r.case for r in records] == ["m0", "m1"] and {r.leg for r in records} == {"leg-x"}
    assert records[0].run_id == "leg-x@run"
    run.finish(kill_rate="1/2")
    manifest = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    assert manifest["complete"] is True and manifest["finished"] and manifest["kill_rate"] == "1/2"
    with pytest.raises(RuntimeError, match="finished"):
        run.add(_record(2))


def test_threads_add_records_without_losing_any(tmp_path):
    run = StreamedRun(tmp_path / "run", kind="mutants", leg="L", args=[])
    threads = [threading.Thread(target=lambda k=k: [run.add(_record(k * 100 + i)) for i in range(25)])
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.finish()
    result = read_records(tmp_path / "run" / RECORDS_FILE)
    assert not result.problems and len({r.case for r in result.records}) == 100
    assert json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())["counts"] == {"passed": 100}


def test_a_reused_directory_starts_clean(tmp_path):
    first = StreamedRun(tmp_path / "run", kind="sanitize", leg="L", args=[])
    first.add(_record(0))
    first.finish()
    second = StreamedRun(tmp_path / "run", kind="sanitize", leg="L", args=[])
    second.finish()
    assert read_records(tmp_path / "run" / RECORDS_FILE).records == []


def test_a_failing_environment_capture_still_writes_the_run(tmp_path, monkeypatch):
    """Should the capture fail, the manifest names why and the records still land."""
    def broken(leg=None):
        raise UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid continuation byte")

    monkeypatch.setattr("harness.run.env.capture", broken)
    run = StreamedRun(tmp_path / "run", kind="sanitize", leg="leg-x", args=[])
    run.add(_record(0))
    run.finish()
    manifest = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())
    assert manifest["complete"] is True and manifest["leg"] == "leg-x"
    assert manifest["env"]["capture_error"].startswith("UnicodeDecodeError")
    assert [r.run_id for r in read_records(tmp_path / "run" / RECORDS_FILE).records] == ["leg-x@run"]
