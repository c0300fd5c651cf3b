"""Baselines: the summary JSON, and regressions (slowdowns, new failures, grown errors) against it."""

from __future__ import annotations

import json

import pytest
from synthetic import env_for, rec, write_run

from harness.report import compare, load_results, make_baseline, read_baseline, write_baseline
from harness.report.baseline import case_key


def _run(tmp_path, name, records, *, mode="gpu", leg="L"):
    return write_run(tmp_path / name, records, leg=leg, env=env_for(leg, mode))


def _bench(case, ms, outcome="passed", **metrics):
    return rec("bench_x", case, outcome, backend="triton", variant="v", metrics={"ms": ms, **metrics})


def test_baseline_is_keyed_without_the_leg(tmp_path):
    a = _run(tmp_path, "a", [_bench("t1", 1.0, max_abs_err=1e-3)], leg="torch2.10")
    b = _run(tmp_path, "b", [_bench("t1", 3.0, max_abs_err=2e-3)], leg="torch2.11")
    path = tmp_path / "base.json"
    data = write_baseline(path, load_results([a, b]))
    assert read_baseline(path) == json.loads(path.read_text()) == data
    (key, entry), = data["cases"].items()
    assert key == "suites/bench_x::t1::triton::v"
    assert entry["legs"] == ["torch2.10", "torch2.11"] and entry["env"] == "gpu/NVIDIA H200"
    assert entry["ms"] == 2.0 and entry["max_abs_err"] == 2e-3 and entry["outcome"] == "passed"
    assert data["source"]["environments"] == ["gpu/NVIDIA H200"]


def test_gpu_figures_win_over_interpreter_figures(tmp_path):
    gpu = _run(tmp_path, "g", [_bench("t1", 0.5)], mode="gpu")
    cpu = _run(tmp_path, "c", [_bench("t1", 900.0), _bench("t2", 10.0)], mode="interpreter", leg="cpu")
    cases = make_baseline(load_results([cpu, gpu]))["cases"]
    assert cases["suites/bench_x::t1::triton::v"]["ms"] == 0.5
    assert cases["suites/bench_x::t2::triton::v"]["env"] == "interpreter/cpu"


@pytest.mark.parametrize(("now_ms", "kind"), [(1.09, None), (1.11, "slower"), (0.89, "faster"), (1.0, None)])
def test_slowdown_threshold(tmp_path, now_ms, kind):
    base = make_baseline(load_results([_run(tmp_path, "a", [_bench("t", 1.0)])]))
    comparison = compare(load_results([_run(tmp_path, "b", [_bench("t", now_ms)])]), base, threshold_pct=10)
    kinds = [f.kind for f in comparison.regressions + comparison.improvements]
    assert kinds == ([kind] if kind else [])
    if kind:
        finding = (comparison.regressions + comparison.improvements)[0]
        assert finding.change_pct == pytest.approx((now_ms - 1.0) * 100)
        assert (finding.baseline, finding.current, finding.metric) == (1.0, now_ms, "ms")


def test_bandwidth_drop_counts_when_no_time_is_recorded(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [rec("b", "t", metrics={"gbps": 1000.0})])]))
    now = load_results([_run(tmp_path, "b", [rec("b", "t", metrics={"gbps": 800.0})])])
    (finding,) = compare(now, base).regressions
    assert finding.kind == "slower" and finding.metric == "gbps" and finding.change_pct == pytest.approx(25.0)


def test_new_failures_grown_errors_new_and_missing_cases(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [
        _bench("fails_now", 1.0), _bench("exact", 1.0, bit_errors=0, max_abs_err=0.0),
        _bench("noisy", 1.0, max_abs_err=1e-3, max_rel_err=1e-3), _bench("gone", 1.0),
        _bench("was_failing", 1.0, "failed")])]))
    now = load_results([_run(tmp_path, "b", [
        _bench("fails_now", 1.0, "crashed"), _bench("exact", 1.0, bit_errors=3, max_abs_err=0.0),
        _bench("noisy", 1.0, max_abs_err=1.9e-3, max_rel_err=2.1e-3), _bench("brand_new", 1.0),
        _bench("was_failing", 1.0, "failed")])])
    comparison = compare(now, base, error_factor=2.0)
    found = sorted((f.kind, f.case, f.metric) for f in comparison.regressions)
    assert found == [("error grew", "exact", "bit_errors"), ("error grew", "noisy", "max_rel_err"),
                     ("new failure", "fails_now", "outcome")]
    assert comparison.new_cases == ["suites/bench_x::brand_new::triton::v"]
    assert comparison.missing_cases == ["suites/bench_x::gone::triton::v"]
    assert comparison.compared == 4


def test_other_environment_compares_outcomes_only(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [_bench("t", 0.5), _bench("u", 0.5)])]))
    now = load_results([_run(tmp_path, "b", [_bench("t", 800.0), _bench("u", 1.0, "failed")],
                             mode="interpreter", leg="cpu")])
    comparison = compare(now, base)
    assert [f.kind for f in comparison.regressions] == ["new failure"]
    assert comparison.not_comparable == ["cpu"]


def test_synthetic_legs_against_a_baseline(legs):
    base = make_baseline(load_results([legs[0]]))
    comparison = compare(load_results([legs[0].parent]), base)
    slower = [f for f in comparison.regressions if f.kind == "slower"]
    assert slower and {f.run_label for f in slower} == {"torch2.10-triton3.5"}
    assert all(f.change_pct > 10 for f in slower)
    assert comparison.not_comparable == ["cpu-interpreter"]
    assert any(f.kind == "new failure" and "S257" in f.case for f in comparison.regressions)


@pytest.mark.parametrize(("text", "match"), [
    ("{nope", "not valid JSON"),
    ('{"format": "other", "version": 1, "cases": {}}', "format='kvh-baseline'"),
    ('{"format": "kvh-baseline", "version": 99, "cases": {}}', "expected version 1"),
    ('{"format": "kvh-baseline", "version": 1, "cases": []}', "'cases' object"),
])
def test_bad_baseline_files_are_named(tmp_path, text, match):
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        read_baseline(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="cannot read"):
        read_baseline(tmp_path / "missing.json")


def test_case_key_parts():
    assert case_key(rec("affine", "test_a[x]")) == "suites/affine::test_a[x]::-::-"
    assert case_key(rec("affine", "t", backend="cuda", variant="warp", leg="any")) == "suites/affine::t::cuda::warp"


def _static(case, **figures):
    return rec("sass_budget", case, backend="triton", variant=case, metrics=figures)


def _static_run(tmp_path, name, mode, triton, **figures):
    leg = f"{mode}-triton{triton}"
    return write_run(tmp_path / name, [_static("dec", **figures)], leg=leg,
                     env=env_for(leg, mode, torch="2.13.0+cpu", triton=triton))


def test_machine_code_figures_compare_per_triton_release_in_any_environment(tmp_path):
    """Instructions per element, registers and spills are the same on every machine for one
    triton release: a CPU run compares them with a baseline written anywhere, release by release,
    whatever its leg is called."""
    baseline = make_baseline(load_results([
        _static_run(tmp_path, "a", "interpreter", "3.6.0", instructions_per_element=6.0, registers=226, stack_bytes=0),
        _static_run(tmp_path, "b", "gpu", "3.4.0", instructions_per_element=7.0, registers=230, stack_bytes=0),
    ]))
    (entry,) = baseline["cases"].values()
    assert entry["static"] == {
        "triton 3.6.0": {"instructions_per_element": 6.0, "registers": 226.0, "stack_bytes": 0.0},
        "triton 3.4.0": {"instructions_per_element": 7.0, "registers": 230.0, "stack_bytes": 0.0}}
    now = load_results([
        # 15% more instructions, and spills where there were none
        _static_run(tmp_path, "c", "interp", "3.6.0", instructions_per_element=6.9, registers=226, stack_bytes=16),
        # fewer instructions: an improvement, in another environment than its baseline figures
        _static_run(tmp_path, "d", "interpreter", "3.4.0", instructions_per_element=5.0, registers=230, stack_bytes=0),
        # a release the baseline does not know: nothing to compare
        _static_run(tmp_path, "e", "interpreter", "3.9.0", instructions_per_element=9.0),
    ])
    comparison = compare(now, baseline)
    grew = {(f.run_label, f.metric): f for f in comparison.regressions}
    assert set(grew) == {("interp-triton3.6.0", "instructions_per_element"), ("interp-triton3.6.0", "stack_bytes")}
    assert grew[("interp-triton3.6.0", "instructions_per_element")].kind == "static grew"
    assert round(grew[("interp-triton3.6.0", "instructions_per_element")].change_pct) == 15
    assert grew[("interp-triton3.6.0", "stack_bytes")].note == "was 0"
    (better,) = comparison.improvements
    assert (better.kind, better.run_label, better.metric) == (
        "static shrank", "interpreter-triton3.4.0", "instructions_per_element")


def test_reference_measurements_move_without_regressing(tmp_path):
    """A baseline timed beside the kernels (metrics ``reference: true``, e.g. torch.compile) that got
    slower, or whose errors grew, is listed as a reference that moved; the kernels' own slowdowns
    still regress, and a reference that now fails is still a new failure."""
    base = make_baseline(load_results([_run(tmp_path, "a", [
        _bench("compiled", 1.0, reference=True, bit_errors=665), _bench("kernel", 1.0),
        _bench("compiled_breaks", 1.0, reference=True), _bench("cpu_loop", 1.0, reference=True,
                                                                max_abs_err=0.0)])]))
    now = load_results([_run(tmp_path, "b", [
        _bench("compiled", 1.6, reference=True, bit_errors=2000), _bench("kernel", 1.5),
        _bench("compiled_breaks", 1.0, "failed", reference=True),
        _bench("cpu_loop", 0.5, reference=True, max_abs_err=1e-3)])])
    comparison = compare(now, base, threshold_pct=10)
    assert sorted((f.kind, f.case) for f in comparison.regressions) == [
        ("new failure", "compiled_breaks"), ("slower", "kernel")]
    assert comparison.improvements == []  # the faster reference is a reference, not an improvement
    # exact-before errors (no percentage) first, then by the size of the change
    assert [(f.kind, f.case, f.metric) for f in comparison.references] == [
        ("error grew", "cpu_loop", "max_abs_err"), ("error grew", "compiled", "bit_errors"),
        ("slower", "compiled", "ms"), ("faster", "cpu_loop", "ms")]


def test_reference_in_another_environment_is_not_compared(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [_bench("compiled", 1.0, reference=True)])]))
    now = load_results([_run(tmp_path, "b", [_bench("compiled", 9.0, reference=True)], mode="interpreter",
                             leg="cpu")])
    comparison = compare(now, base)
    assert comparison.references == [] and comparison.regressions == []
    assert comparison.not_comparable


def test_reference_moves_are_shown_apart_in_every_summary(tmp_path):
    from harness.report import markdown_summary, render_html, summarize, text_summary

    base = make_baseline(load_results([_run(tmp_path, "a", [_bench("compiled", 1.0, reference=True)])]))
    now = load_results([_run(tmp_path, "b", [_bench("compiled", 2.0, reference=True)])])
    summary = summarize(now, compare(now, base, source="b.json"))
    assert summary.n_regressions == 0
    text = text_summary(summary)
    assert "regressions vs b.json (threshold 10%): none" in text
    assert "reference measurements moved (not regressions of these kernels): 1" in text
    assert "not counted as regressions: 1" in markdown_summary(summary)
    html = render_html(summary)
    section = html[html.index("1 reference measurements moved"):]
    section = section[:section.index("</details>")]
    assert "<td class=\"t\">compiled</td>" in section and "<td class=\"t\">slower</td>" in section


@pytest.mark.parametrize("now", [{"ms": float("nan")}, {"ms": 0.0, "gbps": 0.0}, {"ms": "inf", "gbps": -1.0}, {}],
                         ids=["nan", "zero", "inf", "missing"])
def test_a_timing_lost_since_the_baseline_is_a_regression(tmp_path, now):
    from harness.report import render_html, summarize, text_summary

    base = make_baseline(load_results([_run(tmp_path, "a", [rec("b", "t", metrics={"ms": 0.1, "gbps": 10.0}),
                                                           rec("b", "bw", metrics={"gbps": 10.0}),
                                                           rec("b", "never", metrics={"ms": "nan"})])]))
    results = load_results([_run(tmp_path, "b", [rec("b", "t", metrics=now), rec("b", "bw", metrics=now),
                                                 rec("b", "never", metrics=now)])])
    comparison = compare(results, base)
    assert sorted((f.kind, f.case, f.metric, f.baseline) for f in comparison.regressions) == [
        ("timing lost", "bw", "gbps", 10.0), ("timing lost", "t", "ms", 0.1)]
    assert not comparison.improvements
    summary = summarize(results, comparison)
    assert summary.verdict == "REGRESSED" and "2 timing lost" in text_summary(summary)
    assert ">timing lost</span>" in render_html(summary)


def test_a_time_still_recorded_beside_a_lost_bandwidth_is_compared(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [rec("b", "t", metrics={"ms": 0.1, "gbps": 10.0})])]))
    now = load_results([_run(tmp_path, "b", [rec("b", "t", metrics={"ms": 0.1, "gbps": float("nan")})])])
    comparison = compare(now, base)
    assert comparison.regressions == [] and comparison.improvements == [] and comparison.compared == 1
