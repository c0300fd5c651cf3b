"""Aggregation: counts, the suites x legs matrix, per-suite figures, the verdict."""

from __future__ import annotations

import math

import pytest
from synthetic import env_for, rec, write_run

from harness.report import load_results, summarize
from harness.report.summary import Stats, worst


def _summary(tmp_path, records, *, complete=True):
    run_dir = write_run(tmp_path / "r", records, leg="L", env=env_for("L", "gpu"), complete=complete)
    return summarize(load_results([run_dir]))


def test_matrix_cells_count_per_suite_and_leg(legs):
    summary = summarize(load_results([legs[0].parent]))
    names = [s.name for s in summary.suites]
    assert names[0].startswith("suites/") and names[-1] == "tests/harness_self"
    decode = next(s for s in summary.suites if s.name == "suites/decode")
    cpu, bad, good = decode.cells
    assert (cpu.stats.status, cpu.stats.cell_text()) == ("ok", "3/3")
    assert cpu.stats.counts["skipped"] == 1
    assert (bad.stats.status, bad.stats.cell_text()) == ("bad", "3/5")
    assert bad.stats.counts["failed"] == 1 and bad.stats.counts["crashed"] == 1
    assert (good.stats.status, good.stats.cell_text()) == ("ok", "4/4")
    harness_self = summary.suites[-1]
    assert harness_self.cells[1] is None and harness_self.cells[2] is None
    anchors = [c.anchor for s in summary.suites for c in s.present]
    assert len(anchors) == len(set(anchors))
    assert summary.stats.total == sum(s.stats.total for s in summary.suites)
    assert summary.verdict == "FAILED" and summary.verdict_class == "bad"


def test_figures_sum_checked_and_keep_the_worst_error(tmp_path):
    summary = _summary(tmp_path, [
        rec("affine", "a", metrics={"states_checked": 10, "bit_errors": 0, "max_abs_err": 1e-3}),
        rec("affine", "b", metrics={"elements_checked": 5, "bit_errors": 2, "max_abs_err": 4e-3,
                                    "max_rel_err": "nan"}),
        rec("affine", "c", duration_s=1.5),
    ])
    stats = summary.suites[0].stats
    assert stats.checked == 15 and stats.bit_errors == 2 and stats.max_abs_err == 4e-3
    assert math.isnan(stats.max_rel_err) and stats.duration_s == 1.5


def test_worst_treats_nan_as_worst_and_ignores_non_numbers():
    assert worst([1.0, "2.5", None, "x", True]) == 2.5
    assert math.isnan(worst([1.0, float("nan"), 3.0]))
    assert worst([]) is None


@pytest.mark.parametrize(("outcomes", "complete", "verdict"), [
    (["passed", "skipped"], True, "PASSED"),
    (["passed", "failed"], True, "FAILED"),
    (["passed", "timeout"], False, "FAILED"),
    (["passed", "crashed"], True, "FAILED"),
    (["passed"], False, "INCOMPLETE"),
    (["passed"], None, "INCOMPLETE"),
    (["skipped", "skipped"], True, "ALL SKIPPED"),
])
def test_verdict(tmp_path, outcomes, complete, verdict):
    records = [rec("s", f"t{i}", o) for i, o in enumerate(outcomes)]
    assert _summary(tmp_path, records, complete=complete).verdict == verdict


def test_an_unreadable_line_keeps_a_finished_run_from_passing(tmp_path):
    """The lost line may have been a failure: the verdict says the input was not read whole."""
    run_dir = write_run(tmp_path / "r", [rec("s", "t0"), rec("s", "t1", "failed")], leg="L",
                        env=env_for("L", "gpu"))
    records = run_dir / "records.jsonl"
    first, second = records.read_text().splitlines()
    records.write_text(f"{first}\n{second[:40]}\n{first}\n")
    summary = summarize(load_results([run_dir]))
    assert summary.runs[0].complete and summary.counts == {"passed": 2}
    assert summary.n_problems == 1 and summary.verdict == "INCOMPLETE"


def test_cell_text_and_status():
    from collections import Counter
    assert Stats(counts=Counter(passed=3, skipped=2)).cell_text() == "3/3"
    assert Stats(counts=Counter(skipped=2)).cell_text() == "2 skipped"
    assert Stats(counts=Counter(skipped=2)).status == "skip"
    assert Stats(counts=Counter(passed=1, error=1)).status == "bad"
    assert Stats().status == "none"


def test_bad_input_rows_merge_over_legs(legs):
    rows = summarize(load_results([legs[0].parent])).bad_input()
    assert len(rows) == 3
    assert all(len(row.outcomes) == 3 and not row.bad for row in rows)
    assert {row.error_type for row in rows} == {"TypeError", "ValueError"}


def test_a_baseline_timed_beside_the_kernels_is_no_check_of_them(tmp_path):
    """torch.compile's codes differ from the reference in a few ties: the bench records that as the
    baseline's figure, and the run's checks, bit errors and worst errors leave it out."""
    summary = _summary(tmp_path, [
        rec("bench_int8", "k", metrics={"states_checked": 100, "bit_errors": 0, "max_abs_err": 1e-3}),
        rec("bench_int8", "compiled", metrics={"states_checked": 5000, "bit_errors": 665, "max_abs_err": 0.5,
                                              "reference": True}),
    ])
    assert (summary.stats.checked, summary.stats.bit_errors, summary.stats.max_abs_err) == (100, 0, 1e-3)
    assert summary.stats.total == 2 and summary.verdict == "PASSED"
