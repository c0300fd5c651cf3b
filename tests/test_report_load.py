"""Reading and merging result sets: run directories, records files, folders of runs, bad inputs."""

from __future__ import annotations

from synthetic import env_for, rec, write_run

from harness.records import MANIFEST_FILE, RECORDS_FILE
from harness.report import load_results, summarize


def test_folder_of_runs_merges_every_leg(legs):
    results = load_results([legs[0].parent])
    assert [run.leg for run in results.runs] == ["cpu-interpreter", "torch2.10-triton3.5", "torch2.11-triton3.6"]
    assert [run.mode for run in results.runs] == ["interpreter", "gpu", "gpu"]
    assert results.n_records == sum(len(run.records) for run in results.runs) > 100
    assert results.problems == []


def test_killed_leg_reports_truncation_and_incompleteness(legs):
    killed = load_results([legs[2]]).runs[0]
    assert not killed.complete
    assert any("last line (truncated?)" in p for p in killed.problems)
    assert any("incomplete run" in p for p in killed.problems)
    assert all(r.case != "test_cut_off_mid_wr" for r in killed.records)
    complete = load_results([legs[0]]).runs[0]
    assert complete.complete and complete.problems == []


def test_records_file_picks_up_its_manifest(legs):
    via_file = load_results([legs[1] / RECORDS_FILE]).runs[0]
    assert via_file.complete and via_file.gpu == "NVIDIA H200" and via_file.leg == "torch2.10-triton3.5"
    via_manifest = load_results([legs[1] / MANIFEST_FILE]).runs[0]
    assert len(via_manifest.records) == len(via_file.records) and via_manifest.problems == []


def test_missing_inputs_are_problems_not_errors(tmp_path):
    (tmp_path / "empty-folder").mkdir()
    results = load_results([tmp_path / "nowhere", tmp_path / "empty-folder"])
    assert results.runs == []
    assert len(results.problems) == 2
    assert "no such file" in results.problems[0] and "no records.jsonl" in results.problems[1]
    summary = summarize(results)
    assert summary.verdict == "NO RESULTS" and summary.suites == []


def test_run_without_manifest_is_incomplete(tmp_path):
    run_dir = write_run(tmp_path / "r", [rec("affine", "test_a")], leg="L", manifest=False)
    run = load_results([run_dir]).runs[0]
    assert not run.complete and run.leg == "L"
    assert any(MANIFEST_FILE in p for p in run.problems)


def test_empty_run_keeps_its_leg(tmp_path):
    run_dir = write_run(tmp_path / "empty", [], leg="nothing-collected")
    (run_dir / RECORDS_FILE).write_text("")
    results = load_results([run_dir])
    assert [run.leg for run in results.runs] == ["nothing-collected"]
    assert results.runs[0].records == [] and results.runs[0].complete
    assert summarize(results).verdict == "NO RESULTS"


def test_concatenated_records_split_by_leg(tmp_path):
    run_dir = write_run(tmp_path / "cat", [rec("a", "test_1", leg="leg-x"), rec("a", "test_2", leg="leg-y"),
                                           rec("b", "test_3", leg="leg-x")], leg="leg-x",
                        env=env_for("leg-x", "gpu"))
    runs = load_results([run_dir]).runs
    assert [(r.leg, len(r.records), r.has_manifest) for r in runs] == [("leg-x", 2, True), ("leg-y", 1, False)]
    assert runs[1].mode == "unknown" and not runs[1].complete


def test_same_leg_on_two_machines_gets_two_labelled_columns(tmp_path):
    one = write_run(tmp_path / "a" / "run1", [rec("a", "t")], leg="L", env=env_for("L", "gpu", host="box-1"))
    two = write_run(tmp_path / "b" / "run1", [rec("a", "t")], leg="L", env=env_for("L", "gpu", host="box-2"))
    assert [run.label for run in load_results([one, two]).runs] == ["L @ box-1", "L @ box-2"]


def test_suites_and_benchmarks_of_one_leg_merge_into_one_column(tmp_path):
    env = env_for("L", "gpu")
    suites = write_run(tmp_path / "verify-L", [rec("affine", "t1"), rec("affine", "t2")], leg="L", env=env)
    bench = write_run(tmp_path / "verify-L-bench", [rec("bench_x", "b1")], leg="L", env=env, complete=None)
    other = write_run(tmp_path / "verify-M", [rec("affine", "t1")], leg="M", env=env_for("M", "gpu"))
    results = load_results([suites, bench, other, suites])  # the repeated path is read once
    merged, single = results.runs
    assert (merged.label, single.label) == ("L", "M")
    assert [r.case for r in merged.records] == ["t1", "t2", "b1"]
    assert [path.name for path, _ in merged.parts] == ["verify-L", "verify-L-bench"]
    assert not merged.complete and single.complete
    assert any(p.startswith(f"{bench}: incomplete run") for p in merged.problems)
    summary = summarize(results)
    assert [s.name for s in summary.suites] == ["suites/affine", "suites/bench_x"]


def test_runs_of_one_leg_by_different_sessions_stay_apart(tmp_path):
    """gpu_verify's suites and benchmarks are one column; a bench session of the leg is another."""
    env = env_for("L", "gpu")
    runs = tmp_path / "runs"
    dirs = [write_run(runs / "gpu_verify-L", [rec("affine", "t1")], leg="L", env=env),
            write_run(runs / "gpu_verify-L-bench", [rec("bench_x", "b1")], leg="L", env=env),
            write_run(runs / "bench-L", [rec("bench_x", "b1")], leg="L", env=env)]
    results = load_results(dirs)
    assert [(run.session, run.label, [r.case for r in run.records]) for run in results.runs] == [
        ("gpu_verify", "L [gpu_verify-L]", ["t1", "b1"]), ("bench", "L [bench-L]", ["b1"])]
    bench = next(s for s in summarize(results).suites if s.name == "suites/bench_x")
    assert [cell.stats.cell_text() for cell in bench.cells] == ["1/1", "1/1"]
