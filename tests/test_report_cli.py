"""``python -m harness report`` / ``summarize``: files written, exit codes, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness.report.cli import main
from harness.report.text import md_escape

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


def test_pipeline_steps_and_wall_time_go_into_the_report(tmp_path):
    run_dir = _passing_run(tmp_path)
    steps = tmp_path / "gpu_verify-steps.json"
    steps.write_text(json.dumps({"kind": "gpu_verify", "leg": "L", "wall_s": 226.44, "gpus": ["0", "1"], "steps": [
        {"step": "suites", "rc": 0, "ok": True, "seconds": 26.93, "argv": []},
        {"step": "benchmarks", "rc": 1, "ok": False, "seconds": 190.2, "argv": []}]}))
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "-o", str(out), "--steps", str(steps)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "pipeline <b>gpu_verify</b> (leg L)" in html and "suites 26.9 s" in html
    assert "benchmarks 190.2 s (exit 1)" in html and "· pipeline total 226.4 s on 2 GPUs" in html
    # the steps file is the last leg's pipeline; the run's wall time comes from its run directories
    assert "wall time <b>7m 12s</b> (first start to last end of the runs read)" in html
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    assert ("pipeline gpu\\_verify (leg L): suites 26.9 s · benchmarks 190.2 s (exit 1) · pipeline total 226.4 s"
            in markdown)
    assert "wall time **7m 12s** from the first start to the last end of 1 run directory" in markdown


@pytest.mark.parametrize(("ci", "where"), [(None, "{path} (open it in a browser)"),
                                           ("true", "page.html (download the job's artifact and open it)")])
def test_the_summary_says_to_download_the_report_only_in_ci(tmp_path, monkeypatch, ci, where):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    out = tmp_path / "page.html"
    assert main(["report", str(_passing_run(tmp_path)), "-o", str(out), "--no-history"]) == 0
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    assert f"Full report: {where.format(path=md_escape(str(out)))}." in markdown


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"steps": "nope"}), json.dumps([1, 2])])
def test_a_missing_or_broken_steps_file_never_stops_the_report(tmp_path, content):
    run_dir = _passing_run(tmp_path)
    steps = tmp_path / "steps.json"
    if content is not None:
        steps.write_text(content)
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "-o", str(out), "--steps", str(steps)]) == 0
    assert 'id="pipeline"' not in out.read_text(encoding="utf-8")


def test_odd_fields_of_a_steps_file_are_defaulted_not_fatal(tmp_path):
    run_dir = _passing_run(tmp_path)
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"kind": "verify", "wall_s": "soon", "gpus": "0,1", "steps": [
        {"step": "suites", "rc": "x", "ok": "yes", "seconds": "x"}, "junk", {"no": "step"},
        {"step": "report", "rc": "nan", "ok": False, "seconds": "inf"}]}))
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "-o", str(out), "--steps", str(steps)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "report 0.0 s (exit None)" in html
    assert "pipeline <b>verify</b>" in html and "suites 0.0 s (exit None)" in html and "GPU" not in html.split(
        'id="pipeline"')[1].split("</div>")[0]


def test_fail_on_regressions_fails_a_run_not_read_whole(tmp_path):
    """An unreadable line may have been a failure: --fail-on regressions does not pass it."""
    run = _passing_run(tmp_path)
    assert main(["summarize", str(run), "--fail-on", "regressions"]) == 0
    with open(run / "records.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"suite": "affine", "case": "test_b", "outcome": "fai\n')
    assert main(["summarize", str(run), "--fail-on", "failures"]) == 0
    assert main(["summarize", str(run), "--fail-on", "regressions"]) == 1


def test_the_report_reads_the_history_it_is_given_and_never_creates_one(tmp_path, private_history):
    run_dir = _passing_run(tmp_path)
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0  # default: $KVH_HISTORY
    assert f"No trend chart: no run history at {private_history}</p>" in out.read_text(encoding="utf-8")
    assert not private_history.exists()
    assert main(["report", str(run_dir), "-o", str(out), "--no-history"]) == 0
    assert "No trend chart: no run history given" in out.read_text(encoding="utf-8")
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"garbage " * 300)
    assert main(["report", str(run_dir), "-o", str(out), "--history", str(broken)]) == 0
    assert "not a readable SQLite database" in out.read_text(encoding="utf-8")


def test_help_names_every_subcommand_and_ab_takes_its_own_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("report", "summarize", "suspects", "ab"))
    with pytest.raises(SystemExit) as exited:
        main(["ab", "--help"])  # handed to harness/run/ab.py, whose usage names BASE
    assert exited.value.code == 0 and "python -m harness.run.ab [BASE]" in capsys.readouterr().out
