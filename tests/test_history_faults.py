"""The run history under a fleet's faults, against a SQLite file and a PostgreSQL server alike
(the ``history_db`` fixture): many writer processes at once, writers killed with SIGKILL inside
and between their transactions, the server restarted while writers write, a wrong URL or
password, and one history that runners of two GPU models write and the report reads. Each test
counts the runs lost (expected, not in the history) and duplicated (claimed by two writers, or
their cases in twice): always 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness import history
from harness.history_db import BUSY_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
LEG = "gpu-torch2.11.0-triton3.6.0"
CASES_PER_RUN = 4
WRITERS, RUNS_PER_WRITER, SHARED_RUNS = 8, 20, 5
ENV = dict(os.environ, PYTHONPATH=str(ROOT))

# adds its run directories one call at a time, a pause between them, and prints each run it added
SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from harness import history
    location, pause, run_dirs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    for run_dir in run_dirs:
        for run_id in history.add_runs([run_dir], location):
            print(run_id, flush=True)
        time.sleep(pause)
""")

# opens a transaction, writes a run and a thousand cases, says so and waits to be killed
KILLED_INSIDE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness import history, history_db
    location, run_dir = history_db.as_location(sys.argv[1]), Path(sys.argv[2])
    with history_db.writer(location) as engine, engine.connect() as connection:
        run = history._run_row(run_dir)
        connection.execute(history_db.RUNS.insert(), run)
        connection.execute(history_db.CASES.insert(), history._case_rows(run["run_id"], run_dir) * 250)
        print("inside", flush=True)
        time.sleep(60)
""")


def _gpu_env(gpu: str, host: str) -> dict:
    env = env_for(LEG, "gpu", host=host)
    return {**env, "gpu": gpu, "gpus": [{**env["gpus"][0], "name": gpu}]}


def _run(folder: Path, name: str, *, ms: float = 1.0, gpu: str = "NVIDIA H200", host: str = "runner-1") -> Path:
    records = [rec("bench_x", f"t{i}", backend="triton", variant="v", device="cuda",
                   metrics={"ms": ms * (1 + i), "ms_n": 50, "ms_mad": 0.001 * ms}) for i in range(CASES_PER_RUN)]
    return write_run(folder / name, records, leg=LEG, env=_gpu_env(gpu, host))


def _run_id(run_dir: Path) -> str:
    return f"{LEG}@{run_dir.name}@2025-11-29T10:00:00.000+00:00"  # run_key of a synthetic run


@pytest.fixture(scope="module")
def writers_runs(tmp_path_factory) -> tuple[list[list[Path]], list[Path]]:
    """Each writer's own run directories, and those every writer adds (written once: each
    record is fsync'd)."""
    root = tmp_path_factory.mktemp("writers")
    own = [[_run(root, f"w{w}r{r}") for r in range(RUNS_PER_WRITER)] for w in range(WRITERS)]
    return own, [_run(root, f"shared{s}") for s in range(SHARED_RUNS)]


def _lost_and_duplicated(location, expected: list[str], claims: Counter) -> tuple[int, int]:
    """Runs expected but not in the history, and runs claimed by more than one writer or with
    their cases in more than once."""
    held = {run["run_id"]: run["cases"] for run in history.runs(location)}
    lost = len(set(expected) - set(held))
    doubled = {run_id for run_id, n in claims.items() if n > 1} | {
        run_id for run_id, cases in held.items() if cases != CASES_PER_RUN}
    return lost, len(doubled)


def test_many_writers_at_once_lose_and_duplicate_nothing(history_db, writers_runs):
    """Eight processes add twenty runs each at the same moment, and the same five shared runs
    besides: every run is in once, and each shared run was added by exactly one of them."""
    own, shared = writers_runs
    procs = [subprocess.Popen([sys.executable, "-m", "harness.history", "--db", str(history_db), "add",
                               *map(str, runs), *map(str, shared)], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for runs in own]
    added = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        added.append(int(out.split()[0]))  # "N run(s) added to ..."
    expected = [_run_id(d) for runs in own for d in runs] + [_run_id(d) for d in shared]
    assert sum(added) == len(expected)  # no run claimed by two writers
    assert _lost_and_duplicated(history_db, expected, Counter(expected)) == (0, 0)
    assert len(history.cases(history_db)) == len(expected) * CASES_PER_RUN


def test_a_writer_killed_inside_its_transaction_leaves_nothing(history_db, tmp_path):
    """SIGKILL while a run and a thousand of its cases are written but not committed: the history
    is as it was, and the same run goes in at once afterwards (no lock left behind)."""
    history.add_runs([_run(tmp_path, "before")], history_db)
    victim = _run(tmp_path, "victim")
    child = subprocess.Popen([sys.executable, "-c", KILLED_INSIDE, str(history_db), str(victim)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "inside", child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
        child.stdout.close()
        child.stderr.close()
    assert [run["run_id"] for run in history.runs(history_db)] == [_run_id(tmp_path / "before")]
    assert len(history.cases(history_db)) == CASES_PER_RUN
    started = time.monotonic()
    assert history.add_runs([victim], history_db) == [_run_id(victim)]
    assert time.monotonic() - started < BUSY_TIMEOUT_S
    assert _lost_and_duplicated(history_db, [_run_id(tmp_path / "before"), _run_id(victim)], Counter()) == (0, 0)


def _wait_for_runs(location, count: int, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if len(history.runs(location)) >= count:
                return
        except history.HistoryError:
            pass  # a server restarting
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} runs in the history after {deadline_s} s")


def test_a_writer_killed_between_runs_leaves_whole_runs(history_db, writers_runs):
    """SIGKILL in the middle of a writer's twenty runs: the runs in the history are whole (all
    their cases), and adding the twenty again adds exactly the rest."""
    runs = writers_runs[0][0]
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(history_db), "0.05", *map(str, runs)],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_runs(history_db, 3)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
        child.stderr.close()
    before = {run["run_id"] for run in history.runs(history_db)}
    assert 3 <= len(before) < len(runs)
    expected = [_run_id(d) for d in runs]
    rest = history.add_runs(runs, history_db)
    assert sorted(rest) == sorted(set(expected) - before)
    assert _lost_and_duplicated(history_db, expected, Counter([*before, *rest])) == (0, 0)


RESTART_WRITERS, RESTART_RUNS = 4, 20


def test_writers_go_on_through_server_restarts(postgres, writers_runs):
    """Two fast restarts of the server while four writers add twenty runs each, one call per run:
    each writer tries again through them, and every run is in the history once."""
    location = postgres.new_database()
    groups = [runs[:RESTART_RUNS] for runs in writers_runs[0][:RESTART_WRITERS]]
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_WRITER, location, "0.05", *map(str, runs)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for runs in groups]
    try:
        for restart in (1, 2):
            _wait_for_runs(location, restart * 15)
            postgres.restart()
    finally:
        outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    claims = Counter(line for out, _ in outputs for line in out.split())
    expected = [_run_id(d) for runs in groups for d in runs]
    assert sorted(claims) == sorted(expected)
    assert _lost_and_duplicated(location, expected, claims) == (0, 0)


def test_a_wrong_password_or_url_is_one_line_and_the_run_goes_on(postgres, tmp_path, capsys, monkeypatch):
    """The pipeline's history step says what is wrong in one line naming the URL (never the
    password) and returns; so does the command line (exit 2) and the report's rolling baseline."""
    from harness.report import load_results, write_baseline
    from harness.report.cli import main as report_main
    from harness.run.pipeline import record_history

    monkeypatch.setattr("harness.history_db.RECONNECT_S", 1.0)
    run_dir = str(_run(tmp_path, "r"))
    database = postgres.new_database().rsplit("/", 1)[1]
    wrong = {
        "the server refused the login": postgres.url(database, password="not-the-password"),
        "cannot reach the PostgreSQL server, tried for 1 s": postgres.url(database, port=_closed_port()),
        'database "no_such_history" does not exist': postgres.url("no_such_history"),
    }
    for said, url in wrong.items():
        assert record_history([run_dir], url) == []
        line = capsys.readouterr().out.strip()
        assert said in line and "this run is not in it" in line and "\n" not in line, line
        assert history.shown(url) in line and "not-the-password" not in line and "kvh-secret" not in line
        assert history.main(["--db", url, "list"]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err and "kvh-secret" not in err
    monkeypatch.setenv("KVH_HISTORY", wrong["the server refused the login"])
    assert report_main(["summarize", run_dir, "--baseline", "history"]) == 0
    err = capsys.readouterr().err
    assert "no rolling baseline, so no regression check" in err and "refused the login" in err
    # a GPU model without a committed baseline: the report says why its history did not stand in
    committed = tmp_path / "committed.json"
    write_baseline(committed, load_results([_run(tmp_path / "committed", "base")]))
    h100 = _run(tmp_path, "h100", gpu="NVIDIA H100", host="runner-h100")
    assert report_main(["summarize", str(h100), "--baseline", str(committed)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"NVIDIA H100 ({LEG}) has no committed baseline, and the run history cannot be read" in out
    assert "refused the login" in out and "kvh-secret" not in out and "not-the-password" not in out


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again once this returns: nothing listens there


def test_one_history_serves_runners_of_two_gpu_models(history_db, tmp_path, monkeypatch, capsys):
    """Two runners, an H200 and an H100, write one history at once. The committed baseline was
    measured on the H200: the H200 run is compared with it, and the H100 run with the H100's own
    runs in the history once it holds three of them, the report saying how many it has."""
    from harness.report import load_results, write_baseline
    from harness.report.cli import main as report_main

    committed = tmp_path / f"{LEG}.json"
    write_baseline(committed, load_results([_run(tmp_path / "committed", "base", ms=1.0)]))
    h200 = [_run(tmp_path, f"h200-{i}", ms=1.0 + 0.01 * i, host="runner-h200") for i in range(3)]
    h100 = [_run(tmp_path, f"h100-{i}", ms=2.0 + 0.01 * i, gpu="NVIDIA H100", host="runner-h100") for i in range(3)]
    runners = [subprocess.Popen([sys.executable, "-m", "harness.history", "--db", str(history_db), "add",
                                 *map(str, runs)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for runs in (h200, h100[:2])]
    for runner in runners:
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err
    now = [_run(tmp_path / "now", "h200", ms=1.05, host="runner-h200"),
           _run(tmp_path / "now", "h100", ms=2.6, gpu="NVIDIA H100", host="runner-h100")]  # the H100 30% slower
    monkeypatch.setenv("KVH_HISTORY", str(history_db))
    monkeypatch.setenv("COLUMNS", "200")  # the summary cuts its lines to the terminal's width
    argv = ["summarize", *map(str, now), "--baseline", str(committed), "--fail-on", "regressions"]

    assert report_main(argv) == 0  # two H100 runs: not enough to judge by
    out = " ".join(capsys.readouterr().out.split())
    assert "NVIDIA H100 (gpu-torch2.11.0-triton3.6.0) has no committed baseline; the run history holds 2 run(s) " \
           "of it, 3 needed: timings not compared" in out
    assert f"timings not compared (other mode or GPU than the baseline): {LEG} @ runner-h100" in out

    assert history.add_runs([h100[2]], history_db)
    assert report_main(argv) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "the run history holds 3 run(s) of it, 3 needed: timings compared with each case's last 5 runs there " \
           "(threshold 3%)" in out
    assert "timings not compared (other mode" not in out
    summary = report_main(["suspects", *argv[1:-2]])
    assert summary == 0
    suspects = sorted(capsys.readouterr().out.split())
    assert suspects == [f"suites/test_bench_x.py::t{i}" for i in range(CASES_PER_RUN)]  # the H100's, not the H200's
