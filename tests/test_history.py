"""The run history (harness.history): runs in, cases out, pruning, rolling baselines and the
command line, each against a SQLite file and a PostgreSQL server (the ``history_db`` fixture); a
corrupt, missing or locked file. Writers at once, killed writers and a restarted server:
tests/test_history_faults.py."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
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


def test_runs_go_in_once_and_come_out(tmp_path, history_db):
    db = history_db
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


def test_prune_keeps_the_newest_runs_of_each_leg(tmp_path, history_db):
    db = history_db
    dirs = [_run(tmp_path, f"a{i}", started=f"2026-12-0{i + 1}T00:00:00") for i in range(4)]
    dirs.append(_run(tmp_path, "b0", leg="gpu-torch2.8.0-triton3.4.0", started="2026-11-01T00:00:00"))
    history.add_runs(dirs, db)
    assert history.prune(2, db) == 2
    kept = {(r["run_id"].split("@")[1]) for r in history.runs(db)}  # leg@directory@started
    assert kept == {"a2", "a3", "b0"}
    assert len(history.cases(db)) == 3 * 4  # the pruned runs' cases went with them
    with pytest.raises(ValueError, match="keep"):
        history.prune(-1, db)


def test_prune_keeps_ab_rounds_apart_from_the_runs(tmp_path, history_db):
    """Newer A/B rounds do not push the leg's runs out: each kind keeps its own newest."""
    db = history_db
    dirs = [_run(tmp_path, f"a{i}", started=f"2026-12-0{i + 1}T00:00:00") for i in range(2)]
    dirs += [_run(tmp_path, f"ab-head-{i}", started=f"2026-12-0{i + 5}T00:00:00") for i in range(3)]
    history.add_runs(dirs, db)
    assert history.prune(2, db) == 1
    kept = {(r["run_id"].split("@")[1]) for r in history.runs(db)}
    assert kept == {"a0", "a1", "ab-head-1", "ab-head-2"}


def test_a_corrupt_file_is_said_clearly(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(history.HistoryError, match="not a readable SQLite database.*KVH_HISTORY"):
        history.add_runs([_run(tmp_path, "r")], db)
    assert history.main(["--db", str(db), "list"]) == 2
    assert "not a readable SQLite database" in capsys.readouterr().err


def test_listing_a_missing_history_says_so_and_creates_nothing(tmp_path, capsys):
    db = tmp_path / "not" / "yet" / "h.sqlite"
    assert history.main(["--db", str(db), "list"]) == 0
    assert capsys.readouterr().out == f"no runs in {db}\n"
    assert not (tmp_path / "not").exists()
    assert history.runs(db) == []


def test_help_gives_the_whole_first_paragraph(capsys):
    with pytest.raises(SystemExit):
        history.main(["--help"])
    assert "one set of statements serve both)." in " ".join(capsys.readouterr().out.split())


def test_command_line(tmp_path, capsys, monkeypatch, history_db):
    db = history_db
    monkeypatch.setenv("KVH_HISTORY", str(db))
    assert history.history_location() == db
    assert history.main(["add", str(_run(tmp_path, "r1")), str(_run(tmp_path, "r2"))]) == 0
    assert "2 run(s) added" in capsys.readouterr().out
    assert history.main(["list"]) == 0
    assert capsys.readouterr().out.count("4 cases") == 2
    out = tmp_path / "all.csv"
    assert history.main(["export", "--format", "csv", "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 9
    assert history.main(["prune", "--keep", "1"]) == 0
    assert "1 run(s) removed" in capsys.readouterr().out


def test_the_pipeline_records_its_runs_and_survives_a_broken_history(tmp_path, capsys, history_db):
    from harness.run.pipeline import record_history

    runs_dirs = [str(_run(tmp_path, "g1")), str(_run(tmp_path, "g2"))]
    db = history_db
    assert len(record_history(runs_dirs, db)) == 2
    assert "2 run(s) added" in capsys.readouterr().out
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"garbage" * 200)
    assert record_history(runs_dirs, broken) == []
    said = capsys.readouterr().out
    assert "not a readable SQLite database" in said and "this run is not in it" in said


def test_cpu_runs_enter_the_history_when_asked():
    """GPU runs of gpu_verify and bench are kept by default; any run, on CPU too, with --history."""
    from harness.run.pipeline import build_parser, kept_in_history

    args, extra = build_parser().parse_known_args(["verify", "--history", "-k", "pack"])
    assert args.history and extra == ["-k", "pack"]
    assert not build_parser().parse_known_args(["tests"])[0].history
    assert kept_in_history("verify", False, True) and kept_in_history("tests", False, True)
    assert not kept_in_history("verify", False, False) and not kept_in_history("tests", True, False)
    assert kept_in_history("gpu_verify", True, False) and kept_in_history("bench", True, False)


def test_a_run_directory_reused_by_the_next_run_is_a_new_run(tmp_path, history_db):
    """A pipeline writes every run of a kind and leg into the same directory (same run id): each
    run is kept, told apart by its start."""
    db = history_db
    for day in (1, 2):
        shutil.rmtree(tmp_path / "gpu_verify-leg", ignore_errors=True)  # as the pipeline clears it
        history.add_runs([_run(tmp_path, "gpu_verify-leg", ms=float(day), started=f"2026-12-0{day}T00:00:00")], db)
    assert len(history.runs(db)) == 2
    values = history.rolling_values("suites/test_bench_decode.py::test_bench[0]", "ms",
                                    leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=5, path=db)
    assert values == [1.0, 2.0]


def test_a_manifest_that_is_no_object_is_no_crash(tmp_path, history_db):
    db = history_db
    run_dir = _run(tmp_path, "odd")
    (run_dir / "manifest.json").write_text("[]")
    assert len(history.add_runs([run_dir], db)) == 1


def _series_history(tmp_path, db: Path | str) -> Path | str:
    """Four benchmark runs of one leg a day apart (ms 1.0 to 1.3), a suites-only run of that leg
    between them and a run of another leg."""
    dirs = [_run(tmp_path, f"b{day}", ms=1.0 + 0.1 * day, started=f"2026-12-0{day + 1}T00:00:00") for day in range(4)]
    suites_only = write_run(tmp_path / "suites", [rec("decode", "test_x")], leg="gpu-torch2.11.0-triton3.6.0",
                            env=env_for("gpu-torch2.11.0-triton3.6.0", "gpu"))
    manifest = json.loads((suites_only / "manifest.json").read_text())
    (suites_only / "manifest.json").write_text(json.dumps({**manifest, "started": "2026-12-09T00:00:00"}))
    other = _run(tmp_path, "other", leg="gpu-torch2.8.0-triton3.4.0", started="2026-12-10T00:00:00")
    history.add_runs([*dirs, suites_only, other], db)
    return db


def test_case_series_gives_each_case_per_run_oldest_first(tmp_path, history_db):
    db = _series_history(tmp_path, history_db)
    nodeids = {f"suites/test_bench_decode.py::test_bench[{i}]" for i in range(3)} | {
        "suites/test_bench_decode.py::test_broken"}
    runs, series = history.case_series("ms", leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=3,
                                       nodeids=nodeids, path=db)
    assert [r["run_id"].split("@")[1] for r in runs] == ["b1", "b2", "b3"]  # the newest 3, not the suites run
    assert runs[0]["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert runs[0]["started"].startswith("2026-12-02")
    assert series[("suites/test_bench_decode.py::test_bench[1]", "fused")] == pytest.approx([2.2, 2.4, 2.6])
    assert series[("suites/test_bench_decode.py::test_broken", None)] == [None, None, None]  # failed: no figure
    everything, _ = history.case_series("ms", leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=10, path=db)
    assert len(everything) == 5  # without nodeids, every run of the leg
    assert history.case_series("ms", leg="gpu-torch2.11.0-triton3.6.0", gpu=None, last=10, path=db) == ([], {})


def test_case_series_only_reads_and_says_what_is_wrong(tmp_path):
    missing = tmp_path / "none" / "h.sqlite"
    with pytest.raises(history.HistoryError, match="no such file"):
        history.case_series("ms", leg="L", gpu=None, last=5, path=missing)
    assert not missing.parent.exists()  # a reader never creates a history
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(history.HistoryError, match="not a readable SQLite database"):
        history.case_series("ms", leg="L", gpu=None, last=5, path=corrupt)
    db = _series_history(tmp_path, tmp_path / "series.sqlite")
    with sqlite3.connect(db, isolation_level=None) as holder:
        holder.execute("PRAGMA journal_mode=DELETE")  # a writer that locks readers out
        holder.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(history.HistoryError, match="locked"):
            history.case_series("ms", leg="gpu-torch2.11.0-triton3.6.0", gpu="NVIDIA H200", last=5, path=db,
                                timeout_s=0.2)
        assert time.monotonic() - started < 5
        holder.execute("ROLLBACK")


def _bench_run(tmp: Path, name: str, started: str, ms: dict[str, float], *, leg: str = "gpu-torch2.11.0-triton3.6.0",
               complete: bool = True, outcome: str = "passed", **metrics) -> Path:
    """A run directory of benchmark cases ``{case: ms}`` started at ``started``."""
    records = [rec("bench_x", case, outcome, backend="triton", variant="v", device="cuda",
                   metrics={"ms": value, "ms_n": 100, "ms_mad": 0.001, **metrics}) for case, value in ms.items()]
    run_dir = write_run(tmp / name, records, leg=leg, env=env_for(leg, "gpu"), complete=complete)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["started"] = started
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


LEG = "gpu-torch2.11.0-triton3.6.0"


def _rolling_history(tmp: Path, db: Path | str) -> Path | str:
    """Six runs of one leg (the oldest far slower), one incomplete run, a confirmation re-run, an
    A/B round, a suites run without the benchmark and a run of another leg."""
    days = {1: 5.0, 2: 1.00, 3: 1.10, 4: 0.90, 5: 1.20, 6: 1.05}
    dirs = [_bench_run(tmp, f"gpu_verify-L-bench{d}", f"2026-12-0{d}T00:00:00", {"t": ms, "u": 2 * ms})
            for d, ms in days.items()]
    dirs.append(_bench_run(tmp, "killed", "2026-12-07T00:00:00", {"t": 9.0}, complete=False))
    dirs.append(_bench_run(tmp, "gpu_verify-L-bench-confirm", "2026-12-07T01:00:00", {"t": 9.0}))
    dirs.append(_bench_run(tmp, "ab-head-1", "2026-12-07T02:00:00", {"t": 8.5}))
    dirs.append(write_run(tmp / "gpu_verify-L", [rec("affine", "test_ok", metrics={"max_abs_err": 1e-3})],
                          leg=LEG, env=env_for(LEG, "gpu")))
    dirs.append(_bench_run(tmp, "other-leg", "2026-12-08T00:00:00", {"t": 7.0}, leg="gpu-torch2.8.0-triton3.4.0"))
    history.add_runs(dirs, db)
    return db


def test_a_rolling_baseline_is_the_median_of_the_last_runs_with_their_spread(tmp_path, history_db):
    """The newest four complete runs of the leg that ran the case (the suites run between them, the
    incomplete run, the re-run and the other leg left out): the median of their medians, and how
    those spread across the runs as the noise."""
    from harness.report import compare, load_results
    from harness.report.baseline import case_key

    db = _rolling_history(tmp_path, history_db)
    base = history.rolling_baseline(LEG, "NVIDIA H200", last=4, path=db)
    entry = base["cases"]["suites/bench_x::t::triton::v"]
    # days 3 to 6: 1.10, 0.90, 1.20, 1.05
    assert entry["ms"] == pytest.approx(1.075) and entry["ms_n"] == 4 and entry["spread"] == "runs"
    assert entry["ms_min"] == 0.90 and entry["ms_mad"] == pytest.approx(0.075)
    assert entry["ms_iqr"] == pytest.approx(1.125 - 1.0125)
    assert base["cases"]["suites/bench_x::u::triton::v"]["ms"] == pytest.approx(2 * 1.075)
    assert entry["env"] == "gpu/NVIDIA H200" and entry["outcome"] == "passed" and entry["legs"] == [LEG]
    assert base["cases"]["suites/affine::test_ok::-::-"]["max_abs_err"] == 1e-3
    assert base["source"]["rolling"] == 4 and len(base["source"]["runs"]) == 5  # four bench runs, one suites run
    assert not any("confirm" in r or "killed" in r or "@ab-" in r for r in base["source"]["runs"])
    # the keys are the ones compare() looks records up by
    now = load_results([_bench_run(tmp_path, "now", "2026-12-09T00:00:00", {"t": 1.5, "u": 2.5})])
    assert {case_key(r) for r in now.runs[0].records} <= set(base["cases"])
    comparison = compare(now, base)
    # t: +40%, beyond the spread of its runs; u: +16%, within that of its own (twice as wide)
    assert [(f.kind, f.case) for f in comparison.regressions] == [("slower", "t")]
    assert [f.case for f in comparison.within_noise] == ["u"]
    assert not comparison.not_comparable


def test_a_rolling_baseline_of_an_unknown_leg_is_empty(tmp_path, history_db):
    db = _rolling_history(tmp_path, history_db)
    assert history.rolling_baseline("no-such-leg", "NVIDIA H200", last=3, path=db)["cases"] == {}
    with pytest.raises(ValueError, match="last"):
        history.rolling_baseline(LEG, "NVIDIA H200", last=0, path=db)
    with pytest.raises(history.HistoryError, match="no such file"):
        history.rolling_baseline(LEG, "NVIDIA H200", path=tmp_path / "missing.sqlite")


def test_the_worst_outcome_and_errors_of_the_runs_go_into_the_rolling_baseline(tmp_path, history_db):
    db = history_db
    history.add_runs([_bench_run(tmp_path, "r1", "2026-12-01T00:00:00", {"t": 1.0}, max_abs_err=1e-3),
                      _bench_run(tmp_path, "r2", "2026-12-02T00:00:00", {"t": 1.0}, outcome="failed"),
                      _bench_run(tmp_path, "r3", "2026-12-03T00:00:00", {"t": 1.2}, max_abs_err="nan")], db)
    entry = history.rolling_baseline(LEG, "NVIDIA H200", last=3, path=db)["cases"]["suites/bench_x::t::triton::v"]
    assert entry["outcome"] == "failed" and entry["max_abs_err"] == "nan"
    assert entry["ms"] == pytest.approx(1.1) and entry["ms_n"] == 2  # the failed run has no timing


def test_the_report_compares_with_the_rolling_baseline(tmp_path, capsys, monkeypatch, history_db):
    from harness.report.cli import main

    now = _bench_run(tmp_path, "now", "2026-12-09T00:00:00", {"t": 1.5, "u": 2.1})
    # $KVH_HISTORY names no database yet: said, and the summary comes without a regression check
    assert main(["summarize", str(now), "--baseline", "history:4", "--fail-on", "regressions"]) == 0
    captured = capsys.readouterr()
    assert "no such file" in captured.err and "no regression check" in captured.err and "slower" not in captured.out
    monkeypatch.setenv("KVH_HISTORY", str(_rolling_history(tmp_path, history_db)))
    assert main(["summarize", str(now), "--baseline", "history:4", "--fail-on", "regressions"]) == 1
    out = capsys.readouterr().out
    assert f"regressions vs history, each case's last 4 runs ({LEG}: 5 runs read)" in out and "1 slower" in out
    assert main(["summarize", str(now), "--baseline", "history", "--fail-on", "regressions"]) == 1
    with pytest.raises(SystemExit):
        main(["summarize", str(now), "--baseline", "history:zero"])
    assert "history:N with N a positive integer" in capsys.readouterr().err


def test_each_leg_is_compared_with_its_own_history(tmp_path, history_db):
    from harness.report import load_results
    from harness.report.baseline import compare_rolling

    db = _rolling_history(tmp_path, history_db)
    other = "gpu-torch2.8.0-triton3.4.0"
    now = load_results([_bench_run(tmp_path, "now-a", "2026-12-09T00:00:00", {"t": 1.5}),
                        _bench_run(tmp_path, "now-b", "2026-12-09T00:00:00", {"t": 7.1}, leg=other),
                        write_run(tmp_path / "cpu", [rec("bench_x", "t", backend="triton", variant="v",
                                                         metrics={"ms": 900.0})], leg="cpu")])
    comparison = compare_rolling(now, 4, db)
    assert [(f.run_label, f.case) for f in comparison.regressions] == [(LEG, "t")]  # not the other leg's 7.1 ms
    assert comparison.not_comparable == ["cpu"] and comparison.compared == 2
    assert f"{other}: 1 runs read" in comparison.source


def test_trends_leave_out_confirmation_and_ab_runs(tmp_path, history_db):
    """A trend is one commit per run of the leg: re-runs and A/B rounds are not points of it."""
    db = _rolling_history(tmp_path, history_db)
    runs, series = history.case_series("ms", leg=LEG, gpu="NVIDIA H200", last=20, path=db)
    assert len(runs) >= 6 and not any("confirm" in r["run_id"] or "@ab-" in r["run_id"] for r in runs)
    assert 8.5 not in [v for values in series.values() for v in values]


def test_a_run_already_in_the_history_is_not_its_own_baseline(tmp_path, history_db, monkeypatch):
    """Rendering again after the run went into the history compares it with the runs before it."""
    from harness.report import load_results
    from harness.report.baseline import compare_rolling

    db = _rolling_history(tmp_path, history_db)
    now = _bench_run(tmp_path, "now", "2026-12-09T00:00:00", {"t": 1.5, "u": 2.1})
    history.add_runs([now], db)
    comparison = compare_rolling(load_results([now]), 1, db)
    assert [(f.kind, f.case) for f in comparison.regressions] == [("slower", "t")]  # against day 6, not itself


def test_the_history_finds_a_five_percent_slowdown_that_a_baseline_file_lets_pass(tmp_path):
    """Runs of one GPU that agree within 0.5% make their history a tighter yardstick than a baseline
    file (ROLLING_THRESHOLD_PCT, ROLLING_NOISE_FLOOR_PCT): +5% is a regression against the history
    and not against the same figures as a file (10%); against a history that spreads by 6% it is
    within the noise."""
    from harness.report import compare, load_results
    from harness.report.baseline import compare_rolling

    tight, loose = tmp_path / "tight.sqlite", tmp_path / "loose.sqlite"
    for db, spread in ((tight, (1.000, 1.004, 0.997, 1.002)), (loose, (1.00, 1.06, 0.94, 1.03))):
        history.add_runs([_bench_run(tmp_path / db.stem, f"gpu_verify-L-bench{i}", f"2026-12-0{i + 1}T00:00:00",
                                     {"t": ms}) for i, ms in enumerate(spread)], db)
    now = load_results([_bench_run(tmp_path, "now", "2026-12-09T00:00:00", {"t": 1.05})])
    assert [(f.kind, f.case) for f in compare_rolling(now, 4, tight).regressions] == [("slower", "t")]
    against_file = compare(now, history.rolling_baseline(LEG, "NVIDIA H200", last=4, path=tight))
    assert not against_file.regressions and not against_file.within_noise  # under the file's 10%
    loose_check = compare_rolling(now, 4, loose)
    assert not loose_check.regressions and [f.case for f in loose_check.within_noise] == ["t"]
    # an explicit threshold still decides
    assert not compare_rolling(now, 4, tight, threshold_pct=10.0).regressions


def test_a_baseline_file_written_from_the_history_keeps_the_runs_spread(tmp_path, history_db):
    """`history baseline` writes the rolling baseline as a file compare() reads: runs from several
    visits make their offsets the noise, so a later visit's offset is within it."""
    from harness.report import compare, load_results
    from harness.report.baseline import read_baseline

    db = history_db
    visits = (1.00, 1.09, 0.98, 1.11)  # one case on four visits of the same GPU model
    history.add_runs([_bench_run(tmp_path, f"gpu_verify-L-bench{i}", f"2026-12-0{i + 1}T00:00:00", {"t": ms})
                      for i, ms in enumerate(visits)], db)
    out = tmp_path / "baselines" / f"{LEG}.json"
    assert history.main(["--db", str(db), "baseline", "--leg", LEG, "-o", str(out)]) == 0
    data = read_baseline(out)
    entry = data["cases"]["suites/bench_x::t::triton::v"]
    assert data["threshold_pct"] == 10.0 and entry["spread"] == "runs" and entry["ms_n"] == 4
    assert entry["ms"] == pytest.approx(1.045)
    offset = load_results([_bench_run(tmp_path, "now", "2026-12-09T00:00:00", {"t": 1.16})])  # +11%
    check = compare(offset, data)
    assert not check.regressions and [f.case for f in check.within_noise] == ["t"]
    assert history.main(["--db", str(db), "baseline", "--leg", "no-such-leg", "-o", str(out)]) == 2


def test_against_a_history_that_agrees_the_threshold_decides(tmp_path):
    """Runs within 0.1% of each other: +3.5% counts, +2.5% does not (under the 3% threshold), so
    the noise floor never hides a slowdown past the threshold; a misnamed database is said as such,
    and not created."""
    from harness.report import load_results
    from harness.report.baseline import compare_rolling

    db = tmp_path / "agree.sqlite"
    history.add_runs([_bench_run(tmp_path, f"gpu_verify-L-bench{i}", f"2026-12-0{i + 1}T00:00:00", {"t": ms})
                      for i, ms in enumerate((1.000, 1.001, 0.999, 1.000))], db)
    for ms, flagged in ((1.035, True), (1.025, False)):
        now = load_results([_bench_run(tmp_path, f"now{ms}", "2026-12-09T00:00:00", {"t": ms})])
        check = compare_rolling(now, 4, db)
        assert [f.case for f in check.regressions] == (["t"] if flagged else []), ms
        assert not check.within_noise, ms
    missing = tmp_path / "nowhere" / "h.sqlite"
    assert history.main(["--db", str(missing), "baseline", "--leg", LEG, "-o", str(tmp_path / "b.json")]) == 2
    assert not missing.exists()


OLD_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, leg TEXT, mode TEXT, gpu TEXT, commit_sha TEXT, torch TEXT, triton TEXT,
    started TEXT, finished TEXT, complete INTEGER
);
CREATE TABLE cases (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, suite TEXT, nodeid TEXT, variant TEXT,
    backend TEXT, device TEXT, outcome TEXT, duration_s REAL, metrics TEXT
);
CREATE INDEX cases_by_case ON cases (nodeid, variant);
"""


def test_a_history_file_of_the_first_schema_is_read_and_written_as_before(tmp_path):
    """A SQLite history whose cases table has no declared row id (the harness's first schema) is
    read, added to and pruned as before: its rows keep SQLite's own row id."""
    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as old:
        old.executescript(OLD_SCHEMA)
        old.execute("INSERT INTO runs VALUES ('old@r0@2026-11-30T00:00:00', ?, 'gpu', 'NVIDIA H200', 'c0', "
                    "'2.11.0', '3.6.0', '2026-11-30T00:00:00', NULL, 1)", (LEG,))
        old.executemany("INSERT INTO cases VALUES ('old@r0@2026-11-30T00:00:00', 'bench_x', ?, 'v', 'triton', "
                        "'cuda', 'passed', 0.1, ?)", [(f"suites/test_bench_x.py::{case}", json.dumps({"ms": ms}))
                                                      for case, ms in (("t", 1.0), ("u", 2.0))])
    history.add_runs([_bench_run(tmp_path, f"r{day}", f"2026-12-0{day}T00:00:00", {"t": 1.1, "u": 2.2})
                      for day in (1, 2)], db)
    assert [run["cases"] for run in history.runs(db)] == [2, 2, 2]
    runs, series = history.case_series("ms", leg=LEG, gpu="NVIDIA H200", last=5, path=db)
    assert len(runs) == 3 and series[("suites/test_bench_x.py::t", "v")] == [1.0, 1.1, 1.1]
    assert history.rolling_baseline(LEG, "NVIDIA H200", path=db)["cases"]["suites/bench_x::t::triton::v"]["runs_n"] == 3
    assert history.prune(1, db) == 2 and len(history.cases(db)) == 2
