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


def test_the_headline_error_is_the_case_nearest_its_tolerance(tmp_path):
    """A group of huge values reconstructed within its bound has a huge absolute error and is no
    news; the case that went past its tolerance is, named with its leg."""
    from harness.report.summary import tolerance_ratio

    huge = rec("affine", "test_kinds[huge]", backend="torch", variant="huge",
               metrics={"max_abs_err": 5.02e29, "max_rel_err": 1.0, "err_to_tol": 0.97})
    over = rec("decode", "test_decode[S257]", "failed", backend="triton", variant="splitk",
               metrics={"max_abs_err": 3.1e-2, "tolerance": 2e-3})
    plain = rec("decode", "test_decode[S1]", metrics={"max_abs_err": 1e-5})  # no tolerance: not rated
    compiled = rec("bench_int8", "compiled", metrics={"max_abs_err": 9.0, "tolerance": 1e-3, "reference": True})
    summary = _summary(tmp_path, [huge, over, plain, compiled])
    assert tolerance_ratio(huge) == 0.97 and tolerance_ratio(over) == pytest.approx(15.5)
    assert tolerance_ratio(plain) is None
    assert tolerance_ratio(rec("s", "t", metrics={"max_abs_err": 1.0, "tolerance": 0})) is None
    figure = summary.closest_to_tolerance()
    assert figure.ratio == pytest.approx(15.5) and figure.rated == 2  # the baseline timed beside them is no check
    assert figure.where == "suites/decode::test_decode[S257] [triton/splitk] on L"
    assert summary.suites[0].stats.worst_to_tol == 0.97  # suites/affine
    nan = _summary(tmp_path / "nan", [over, rec("decode", "t_nan", metrics={"max_abs_err": "nan", "tolerance": 1.0})])
    assert nan.closest_to_tolerance().record.case == "t_nan"  # NaN is the worst of all
    assert _summary(tmp_path / "none", [plain]).closest_to_tolerance() is None


def test_wall_time_spans_every_run_directory_read(tmp_path):
    """Legs of one family run one after another: the run took from the first start to the last end,
    not the last leg's time; a run cut short ends at its last record."""
    import json

    from synthetic import RECORD_TIME

    def timed_run(name, started, finished, last_record):
        run_dir = write_run(tmp_path / name, [rec("s", "t")], leg=name, env=env_for(name, "gpu"),
                            complete=True if finished else None)
        manifest = json.loads((run_dir / "manifest.json").read_text())
        (run_dir / "manifest.json").write_text(json.dumps({**manifest, "started": started, "finished": finished}))
        records = run_dir / "records.jsonl"
        records.write_text(records.read_text().replace(RECORD_TIME, last_record))
        return run_dir

    dirs = [timed_run("a", "2026-01-01T10:00:00+00:00", "2026-01-01T10:09:00+00:00", "2026-01-01T10:08:00+00:00"),
            timed_run("b", "2026-01-01T10:10:00", "2026-01-01T10:27:00", "2026-01-01T10:26:00")]  # no zone: UTC
    assert summarize(load_results(dirs)).wall_s == 27 * 60
    cut = timed_run("cut", "2026-01-01T10:28:00+00:00", None, "2026-01-01T10:40:00+00:00")
    assert summarize(load_results([*dirs, cut])).wall_s == 40 * 60
    assert summarize(load_results([tmp_path / "missing"])).wall_s is None


def test_case_rows_put_each_case_once_with_one_cell_per_leg(legs):
    summary = summarize(load_results([legs[0].parent]))
    decode = next(s for s in summary.suites if s.name == "suites/decode")
    rows = decode.case_rows()
    assert len(rows) == len({r.case for cell in decode.present for r in cell.records})
    assert rows[0].bad and all(len(row.legs) == len(decode.present) for row in rows)
    gpu_row = next(row for row in rows if row.case == "test_decode_matches_fp64[cuda:0-S4096]")
    assert [len(records) for records in gpu_row.legs] == [0, 1, 1]  # not on the interpreter leg
    assert gpu_row.impl == "triton/splitk" and not gpu_row.bad
