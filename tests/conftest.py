"""Fixtures for the harness's own tests: pytester, synthetic result sets, a rendered report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synthetic import write_history, write_legs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_history(tmp_path, monkeypatch) -> Path:
    """Each test's own run history (harness.history): a pipeline a test runs on a pretend GPU never
    writes into the user's."""
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("KVH_HISTORY", str(path))
    return path


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of this test session's own (tests/postgres_server.py)."""
    from postgres_server import NO_SERVER, PostgresServer, server_binaries

    binaries = server_binaries()
    if binaries is None:
        pytest.skip(NO_SERVER)
    server = PostgresServer(binaries).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def history_db(request, tmp_path) -> Path | str:
    """A new, empty run history: a SQLite file, then a database on this session's PostgreSQL server
    (its URL): every test that takes it runs against both."""
    if request.param == "sqlite":
        return tmp_path / "h.sqlite"
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture
def legs(tmp_path) -> list[Path]:
    """Three run directories (two GPU legs, one killed interpreter leg); fresh per test."""
    return write_legs(tmp_path / "runs")


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict:
    """The synthetic legs rendered once through the command line, with a baseline from one leg and a
    run history of six earlier runs of that leg (trend charts)."""
    from harness.report import load_results, write_baseline
    from harness.report.cli import main

    root = tmp_path_factory.mktemp("rendered")
    legs = write_legs(root / "runs")
    baseline = root / "baseline.json"
    write_baseline(baseline, load_results([legs[0]]))
    history = root / "history.sqlite"
    write_history(history, root / "earlier")
    out = root / "report.html"
    assert main(["report", str(root / "runs"), "-o", str(out), "--baseline", str(baseline),
                 "--history", str(history)]) == 0
    return {
        "root": root,
        "legs": legs,
        "baseline": baseline,
        "history": history,
        "html_path": out,
        "html": out.read_text(encoding="utf-8"),
        "junit": root / "report.junit.xml",
        "markdown": root / "report.md",
    }


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    return path
