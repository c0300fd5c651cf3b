"""The run history (harness.history): runs in, cases out, concurrent writers, a writer killed
mid-transaction, a corrupt file, pruning and the command line."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness import history

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, name: str, *, leg: str = "gpu-torch2.11.0-triton3.6.0", ms: float = 1.0,
         started: str | None = None, cases: int = 3) -> Path:
    records = [rec("bench_decode", f"test_bench[{i}]", variant="fused", backend="triton", device="cuda",
                   metrics={"ms": ms * (1 + i), "speedup": {"sdpa_fp16": 3.0}}) for i in range(cases)]
    records.append(rec("bench_decode", "test_broken", "failed", metrics={"ms": 9.0}))
    run_dir = write_run(tmp / name, records, leg=leg, env=env_for(leg, "gpu"))
    if started:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        manifest["started"] = started
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def test_runs_go_in_once_and_come_out(tmp_path):
    db = tmp_path / "h.sqlite"
    first, second = _run(tmp_path, "r1", ms=1.0, started="2026-12-01T00:00:00"), _run(
        tmp_path, "r2", ms=1.1, started="2026-12-02T00:00:00")
    assert history.add_runs([first, second], db) == [f"gpu-torch2.11.0-triton3.6.0@{n}@2026-12-0{d}T00:00:00"
                                                     for n, d in (("r1", 1), ("r2", 2))]
    assert history.add_runs([first], db) == []  # already there: not added twice
    assert history.add_runs([tmp_path / "missing"], db) == []
    listed = history.runs(db)
    assert [r["cases"] for r in listed] == [4, 4] and listed[0]["gpu"] == "NVIDIA H200"
    assert listed[0]["commit"] == "0123456789abcdef0123456789abcdef01234567"
    values = history.rolling_values("suites/test_bench_decode.py::test_bench[1]", "ms",
                                    leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=5, path=db)
    assert values == pytest.approx([2.0, 2.2])  # oldest first; the failed case is no baseline
    assert history.rolling_values("suites/test_bench_decode.py::test_broken", "ms", leg="gpu-torch2.11.0-triton3.6.0",
                                  gpu="NVIDIA H200", last=5, path=db) == []
    out = io.StringIO()
    assert history.export("csv", out, db) == 8
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("run_id,leg,gpu") and len(lines) == 9
    out = io.StringIO()
    history.export("json", out, db)
    rows = json.loads(out.getvalue())
    assert rows[0]["metrics"]["speedup"] == {"sdpa_fp16": 3.0}
    with pytest.raises(ValueError, match="format"):
        history.export("xml", io.StringIO(), db)


def test_prune_keeps_the_newest_runs_of_each_leg(tmp_path):
    db = tmp_path / "h.sqlite"
    dirs = [_run(tmp_path, f"a{i}", started=f"2026-12-0{i + 1}T00:00:00") for i in range(4)]
    dirs.append(_run(tmp_path, "b0", leg="gpu-torch2.8.0-triton3.4.0", started="2026-11-01T00:00:00"))
    history.add_runs(dirs, db)
    assert history.prune(2, db) == 2
    kept = {(r["run_id"].split("@")[1]) for r in history.runs(db)}  # leg@directory@started
    assert kept == {"a2", "a3", "b0"}
    assert len(history.cases(db)) == 3 * 4  # the pruned runs' cases went with them
    with pytest.raises(ValueError, match="keep"):
        history.prune(-1, db)


def _writer(db: str, run_dirs: list[str], done) -> None:
    history.add_runs(run_dirs, Path(db))
    done.put(len(run_dirs))


def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "h.sqlite"
    groups = [[str(_run(tmp_path, f"p{p}r{i}", cases=20)) for i in range(5)] for p in range(4)]
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(db), g, done)) for g in groups]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(done.get(timeout=5) for _ in procs) == [5, 5, 5, 5]
    assert len(history.runs(db)) == 20 and len(history.cases(db)) == 20 * 21
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness import history
    db = history._connect(Path(sys.argv[1]))
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO runs (run_id, leg) VALUES ('half-written', 'leg')")
    db.executemany("INSERT INTO cases (run_id, nodeid) VALUES ('half-written', ?)", [(str(i),) for i in range(1000)])
    print("inside", flush=True)
    time.sleep(60)
""")


def test_a_writer_killed_mid_run_leaves_the_history_as_it_was(tmp_path):
    db = tmp_path / "h.sqlite"
    history.add_runs([_run(tmp_path, "before")], db)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(db)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "inside"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert [r["run_id"].split("@")[1] for r in history.runs(db)] == ["before"]
    started = time.monotonic()
    assert history.add_runs([_run(tmp_path, "after")], db)  # the killed writer's lock is gone
    assert time.monotonic() - started < history.BUSY_TIMEOUT_S
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert check.execute("SELECT COUNT(*) FROM cases WHERE run_id = 'half-written'").fetchone() == (0,)


def test_a_corrupt_file_is_said_clearly(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(history.HistoryError, match="not a readable SQLite database.*KVH_HISTORY"):
        history.add_runs([_run(tmp_path, "r")], db)
    assert history.main(["--db", str(db), "list"]) == 2
    assert "not a readable SQLite database" in capsys.readouterr().err


def test_command_line(tmp_path, capsys, monkeypatch):
    db = tmp_path / "cli.sqlite"
    monkeypatch.setenv("KVH_HISTORY", str(db))
    assert history.history_path() == db
    assert history.main(["add", str(_run(tmp_path, "r1")), str(_run(tmp_path, "r2"))]) == 0
    assert "2 run(s) added" in capsys.readouterr().out
    assert history.main(["list"]) == 0
    assert capsys.readouterr().out.count("4 cases") == 2
    out = tmp_path / "all.csv"
    assert history.main(["export", "--format", "csv", "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 9
    assert history.main(["prune", "--keep", "1"]) == 0
    assert "1 run(s) removed" in capsys.readouterr().out


def test_the_pipeline_records_its_runs_and_survives_a_broken_history(tmp_path, capsys):
    from harness.run.pipeline import record_history

    runs_dirs = [str(_run(tmp_path, "g1")), str(_run(tmp_path, "g2"))]
    db = tmp_path / "p.sqlite"
    assert len(record_history(runs_dirs, db)) == 2
    assert "2 run(s) added" in capsys.readouterr().out
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"garbage" * 200)
    assert record_history(runs_dirs, broken) == []
    said = capsys.readouterr().out
    assert "not a readable SQLite database" in said and "this run is not in it" in said


def test_a_run_directory_reused_by_the_next_run_is_a_new_run(tmp_path):
    """A pipeline writes every run of a kind and leg into the same directory (same run id): each
    run is kept, told apart by its start."""
    db = tmp_path / "h.sqlite"
    for day in (1, 2):
        shutil.rmtree(tmp_path / "gpu_verify-leg", ignore_errors=True)  # as the pipeline clears it
        history.add_runs([_run(tmp_path, "gpu_verify-leg", ms=float(day), started=f"2026-12-0{day}T00:00:00")], db)
    assert len(history.runs(db)) == 2
    values = history.rolling_values("suites/test_bench_decode.py::test_bench[0]", "ms",
                                    leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=5, path=db)
    assert values == [1.0, 2.0]


def test_a_manifest_that_is_no_object_is_no_crash(tmp_path):
    db = tmp_path / "h.sqlite"
    run_dir = _run(tmp_path, "odd")
    (run_dir / "manifest.json").write_text("[]")
    assert len(history.add_runs([run_dir], db)) == 1
