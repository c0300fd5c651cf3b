"""``python -m harness report`` / ``summarize``: files written, exit codes, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness.report.cli import main

ROOT = Path(__file__).resolve().parents[1]



def _passing_run(tmp_path):
    return write_run(tmp_path / "ok", [rec("affine", "test_a", metrics={"ms": 1.0, "gbps": 10.0})],
                     leg="L", env=env_for("L", "gpu"))


def test_report_writes_page_junit_markdown_and_summary(rendered, capsys):
    root = rendered["root"]
    assert rendered["html_path"].exists() and rendered["junit"].exists()
    assert rendered["markdown"].read_text().startswith("### ")
    assert sorted(p.name for p in root.iterdir() if p.suffix in (".html", ".xml", ".md", ".tmp")) == [
        "report.html", "report.junit.xml", "report.md"]


def test_report_prints_summary_and_writes_baseline(tmp_path, capsys):
    run_dir = _passing_run(tmp_path)
    out = tmp_path / "site" / "page.html"
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    code = main(["report", str(run_dir), "-o", str(out), "--junit", str(tmp_path / "j.xml"),
                 "--summary-md", str(step_summary), "--write-baseline", str(tmp_path / "b" / "base.json")])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("kv harness: PASSED") and f"report:   {out}" in printed
    assert f"baseline: {tmp_path / 'b' / 'base.json'}" in printed
    assert (tmp_path / "j.xml").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["page.html"]
    assert step_summary.read_text().startswith("earlier step\n### \u2705 kv harness: PASSED")
    baseline = json.loads((tmp_path / "b" / "base.json").read_text())
    assert list(baseline["cases"]) == ["suites/affine::test_a::-::-"]


def test_fail_on_and_summarize(legs, tmp_path, capsys):
    ok = _passing_run(tmp_path)
    assert main(["summarize", str(ok), "--fail-on", "failures"]) == 0
    assert main(["summarize", str(legs[0].parent)]) == 0
    assert main(["summarize", str(legs[0].parent), "--fail-on", "failures"]) == 1
    assert main(["summarize", str(legs[2]), "--fail-on", "failures"]) == 0  # incomplete, nothing failed
    assert main(["summarize", str(legs[2]), "--fail-on", "regressions"]) == 1
    capsys.readouterr()
    assert main(["summarize", str(ok), "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("### \u2705 kv harness: PASSED")


def test_bad_baseline_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit) as info:
        main(["report", str(_passing_run(tmp_path)), "-o", str(tmp_path / "r.html"), "--baseline", str(bad)])
    assert info.value.code == 2
    assert "format='kvh-baseline'" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_module_entry_point(tmp_path):
    run_dir = _passing_run(tmp_path)
    done = subprocess.run([sys.executable, "-m", "harness", "summarize", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kv harness: PASSED  (1 leg(s), 1 cases")
