"""Baselines: the summary JSON, and regressions (slowdowns, new failures, grown errors) against it."""

from __future__ import annotations

import json
import math

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


# -- noise, categories and confirmation ------------------------------------------------------------


def _timed(case, ms, mad, *, n=200, device="cuda:0", outcome="passed", **metrics):
    """A benchmark record whose ms carries its repeats' spread (as harness.measure.timing records it)."""
    return rec("bench_x", case, outcome, backend="triton", variant="v", device=device,
               metrics={"ms": ms, "ms_n": n, "ms_min": ms - 2 * mad, "ms_iqr": 1.349 * 1.4826 * mad,
                        "ms_mad": mad, **metrics})


def _against(tmp_path, before, after, **options):
    base = make_baseline(load_results([_run(tmp_path, "a", before)]))
    return compare(load_results([_run(tmp_path, "b", after)]), base, **options)


def test_a_shift_beyond_small_noise_is_flagged(tmp_path):
    comparison = _against(tmp_path, [_timed("t", 1.0, 0.005)], [_timed("t", 1.15, 0.005)])
    (finding,) = comparison.regressions
    assert (finding.kind, finding.category, finding.confirmed) == ("slower", "kernel", None)
    assert finding.change_pct == pytest.approx(15.0)
    assert finding.noise_pct < 15.0 and finding.stands_out and "beyond the noise" in finding.note
    assert finding.nodeid == "suites/test_bench_x.py::t"
    assert [f.nodeid for f in comparison.suspects()] == ["suites/test_bench_x.py::t"]


def test_the_same_shift_inside_large_noise_is_not(tmp_path):
    from harness.report import summarize

    # few, widely spread repeats: the medians themselves are uncertain by about 8% each
    after = load_results([_run(tmp_path, "b", [_timed("t", 1.15, 0.1, n=5)])])
    base = make_baseline(load_results([_run(tmp_path, "a", [_timed("t", 1.0, 0.1, n=5)])]))
    comparison = compare(after, base)
    assert comparison.regressions == [] and comparison.suspects() == []
    (finding,) = comparison.within_noise
    assert finding.noise_pct > 15.0 and not finding.stands_out and "within the noise" in finding.note
    assert summarize(after, comparison).verdict == "PASSED"


def test_many_jittery_repeats_still_pin_their_median(tmp_path):
    """Repeats spread by 10% but 200 of them: their median is known to about 1.3%, so a 40%
    slowdown of a short kernel is a regression, not noise."""
    comparison = _against(tmp_path, [_timed("t", 0.010, 0.001)], [_timed("t", 0.014, 0.001)])
    (finding,) = comparison.regressions
    assert finding.noise_pct < 15.0 and finding.stands_out  # the repeats' own spread would say +-60%


def test_a_host_bound_case_that_was_device_bound_still_counts(tmp_path):
    """A change that puts host work into a call must not excuse its own slowdown."""
    comparison = _against(tmp_path, [_timed("t", 1.0, 0.005, bound="device")],
                          [_timed("t", 1.5, 0.005, bound="host")])
    assert [f.category for f in comparison.regressions] == ["kernel"] and comparison.host_bound == []


def test_a_lost_timing_counts_whatever_bounds_the_case(tmp_path):
    comparison = _against(tmp_path, [_timed("t", 0.04, 0.001, bound="host")],
                          [rec("bench_x", "t", backend="triton", variant="v", device="cuda:0",
                               metrics={"ms": float("nan"), "bound": "host"})])
    assert [f.kind for f in comparison.regressions] == ["timing lost"]


def test_noise_is_weighed_on_both_sides(tmp_path):
    """A quiet baseline does not make a noisy run's slowdown real, nor the other way round."""
    assert _against(tmp_path, [_timed("t", 1.0, 0.005)], [_timed("t", 1.15, 0.1, n=5)]).regressions == []
    assert _against(tmp_path, [_timed("u", 1.0, 0.1, n=5)], [_timed("u", 1.15, 0.005)]).regressions == []


def test_equal_distributions_are_not_flagged(tmp_path):
    comparison = _against(tmp_path, [_timed("t", 1.0, 0.05)], [_timed("t", 1.0, 0.05)])
    assert not (comparison.regressions or comparison.improvements or comparison.within_noise)


def test_a_speedup_inside_the_noise_is_no_improvement(tmp_path):
    assert _against(tmp_path, [_timed("t", 1.0, 0.1, n=5)], [_timed("t", 0.85, 0.1, n=5)]).improvements == []
    (better,) = _against(tmp_path, [_timed("u", 1.0, 0.001)], [_timed("u", 0.85, 0.001)]).improvements
    assert better.kind == "faster"


def test_the_baseline_keeps_each_cases_spread(tmp_path):
    base = make_baseline(load_results([_run(tmp_path, "a", [_timed("t", 1.0, 0.01, bound="host"),
                                                            _bench("old", 2.0)])]))
    entry = base["cases"]["suites/bench_x::t::triton::v"]
    assert entry["ms_n"] == 200 and entry["ms_mad"] == 0.01 and entry["ms_min"] == pytest.approx(0.98)
    assert entry["ms_iqr"] == pytest.approx(1.349 * 1.4826 * 0.01)
    assert entry["spread"] == "repeats" and entry["bound"] == "host"
    assert not {"ms_n", "ms_mad", "spread", "bound"} & set(base["cases"]["suites/bench_x::old::triton::v"])


@pytest.mark.parametrize(("now_ms", "regressed"), [(1.09, False), (1.11, True)])
def test_an_old_baseline_without_spread_compares_by_the_threshold(tmp_path, now_ms, regressed):
    """A baseline written before the spread was kept: its noise is the floor (2% of the median), so
    with a current figure at the floor too a change must pass about 9%, and the 10% threshold decides."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "kvh-baseline", "version": 1, "created": "2026-11-01", "threshold_pct": 10.0,
                                "cases": {"suites/bench_x::t::triton::v": {
                                    "suite": "suites/bench_x", "case": "t", "backend": "triton", "variant": "v",
                                    "env": "gpu/NVIDIA H200", "legs": ["L"], "outcome": "passed", "ms": 1.0}}}))
    for name, now in (("plain", [_bench("t", now_ms)]), ("spread", [_timed("t", now_ms, 0.001)])):
        comparison = compare(load_results([_run(tmp_path, name, now)]), read_baseline(path))
        assert [f.kind for f in comparison.regressions] == (["slower"] if regressed else [])
        if regressed:
            assert comparison.regressions[0].noise_pct == pytest.approx(300 * math.hypot(0.02, 0.02 * now_ms), rel=0.05)


def test_host_bound_and_cpu_baseline_slowdowns_never_regress(tmp_path):
    """On a GPU run, a host-bound call (its figure is the host's launch cost) and a case on the CPU
    (a CPU baseline timed on the GPU host) that got slower, even far beyond noise and threshold,
    are listed apart and leave the verdict PASSED; a kernel's own slowdown beside them still counts."""
    from harness.report import markdown_summary, render_html, summarize, text_summary

    before = [_timed("launch", 0.041, 0.001, bound="host"), _timed("cpu_pack", 0.57, 0.005, device="cpu"),
              _timed("cpu_wall", 0.33, 0.005, device=None, bound="cpu"), _timed("kernel", 1.0, 0.005, bound="device")]
    after = [_timed("launch", 0.110, 0.001, bound="host"), _timed("cpu_pack", 0.68, 0.005, device="cpu"),
             _timed("cpu_wall", 0.40, 0.005, device=None, bound="cpu"), _timed("kernel", 1.0, 0.005, bound="device")]
    results = load_results([_run(tmp_path, "b", after)])
    comparison = compare(results, make_baseline(load_results([_run(tmp_path, "a", before)])), source="h200.json")
    assert comparison.regressions == [] and comparison.suspects() == []
    assert [(f.case, f.category) for f in comparison.host_bound] == [("launch", "host-bound")]
    assert sorted((f.case, f.category) for f in comparison.cpu_baselines) == [
        ("cpu_pack", "cpu baseline"), ("cpu_wall", "cpu baseline")]
    summary = summarize(results, comparison)
    assert summary.verdict == "PASSED"
    text = text_summary(summary)
    assert "regressions vs h200.json (threshold 10%): none" in text
    assert "not counted, host-bound (the host's launch cost): 1" in text
    assert "not counted, CPU baselines timed on the GPU host: 2" in text
    assert "1 host-bound (the host's launch cost); 2 CPU baselines" in markdown_summary(summary)
    html = render_html(summary)
    section = html[html.index('id="timing-host-bound"'):]
    assert "<td class=\"t\">launch</td>" in section[:section.index("</details>")]
    assert 'id="timing-cpu-baselines"' in html

    # the same slowdowns with the kernel's own figure slower too: only the kernel counts
    after[3] = _timed("kernel", 1.3, 0.005, bound="device")
    comparison = compare(load_results([_run(tmp_path, "c", after)]),
                         make_baseline(load_results([_run(tmp_path, "a", before)])))
    assert [(f.kind, f.case) for f in comparison.regressions] == [("slower", "kernel")]


def test_cpu_cases_of_an_interpreter_run_are_no_cpu_baselines(tmp_path):
    """Without a GPU every case runs on the CPU: they are the kernels' own figures there."""
    base = make_baseline(load_results([_run(tmp_path, "a", [_timed("t", 1.0, 0.001, device="cpu", bound="cpu")],
                                            mode="interpreter", leg="cpu")]))
    now = load_results([_run(tmp_path, "b", [_timed("t", 1.5, 0.001, device="cpu", bound="cpu")],
                             mode="interpreter", leg="cpu")])
    assert [f.category for f in compare(now, base).regressions] == ["kernel"]


def _bench_and_rerun(tmp_path, first, rerun):
    """A gpu_verify benchmark directory and, given ``rerun``, its confirmation re-run beside it."""
    dirs = [_run(tmp_path, "gpu_verify-L-bench", first)]
    if rerun is not None:
        dirs.append(_run(tmp_path, "gpu_verify-L-bench-confirm", rerun))
    return load_results(dirs)


def test_a_suspected_slowdown_that_does_not_repeat_is_unconfirmed(tmp_path):
    from harness.report import summarize

    base = make_baseline(load_results([_run(tmp_path, "a", [_timed("noisy", 1.0, 0.005), _timed("real", 1.0, 0.005),
                                                            _timed("steady", 1.0, 0.005)])]))
    first = [_timed("noisy", 1.2, 0.005), _timed("real", 1.3, 0.005), _timed("steady", 1.0, 0.005)]
    results = _bench_and_rerun(tmp_path, first, [_timed("noisy", 1.01, 0.005), _timed("real", 1.29, 0.005)])
    assert len(results.runs) == 1 and [r.label for r in results.confirmations] == ["L (re-run)"]
    assert len(results.runs[0].records) == 3  # the re-run is no column and adds no record
    comparison = compare(results, base)
    (unconfirmed,) = comparison.unconfirmed
    assert (unconfirmed.case, unconfirmed.confirmed) == ("noisy", False)
    assert "not repeated by its re-run (+1.0%" in unconfirmed.note
    (confirmed,) = comparison.regressions
    assert (confirmed.case, confirmed.confirmed, confirmed.change_pct) == ("real", True, pytest.approx(30.0))
    assert comparison.confirmed == [confirmed] and comparison.suspects() == []
    assert comparison.reruns == ["L (re-run)"]
    assert summarize(results, comparison).verdict == "REGRESSED"

    # the re-run repeats nothing: no regression is left, the verdict does not regress
    results = _bench_and_rerun(tmp_path / "2", first, [_timed("noisy", 1.0, 0.005), _timed("real", 1.02, 0.005)])
    comparison = compare(results, base)
    assert comparison.regressions == [] and {f.case for f in comparison.unconfirmed} == {"noisy", "real"}
    assert summarize(results, comparison).verdict == "PASSED"


def test_a_slowdown_without_a_rerun_figure_still_counts(tmp_path):
    """No re-run (a report rendered by hand), or a re-run that lost the case: the slowdown is
    unsettled and counts, as it did before re-runs existed."""
    base = make_baseline(load_results([_run(tmp_path, "a", [_timed("t", 1.0, 0.005), _timed("u", 1.0, 0.005)])]))
    first = [_timed("t", 1.3, 0.005), _timed("u", 1.3, 0.005)]
    for rerun, note in ((None, None), ([_timed("u", 1.0, 0.005, outcome="crashed")], "its re-run has no figure")):
        comparison = compare(_bench_and_rerun(tmp_path / str(note), first, rerun), base)
        t = next(f for f in comparison.regressions if f.case == "t")
        assert t.confirmed is None and (note is None or note in t.note)
        assert {f.case for f in comparison.regressions} == {"t", "u"}


def test_suspects_command_prints_the_cases_to_rerun(tmp_path, capsys):
    from harness.report.cli import main

    base_path = tmp_path / "base.json"
    write_baseline(base_path, load_results([_run(tmp_path, "a", [
        _timed("kernel", 1.0, 0.005), _timed("noisy", 1.0, 0.2, n=5), _timed("launch", 0.04, 0.001, bound="host"),
        _timed("steady", 1.0, 0.005)])]))
    bench = _run(tmp_path, "gpu_verify-L-bench", [
        _timed("kernel", 1.3, 0.005), _timed("noisy", 1.3, 0.2, n=5), _timed("launch", 0.11, 0.001, bound="host"),
        _timed("steady", 1.0, 0.005)])
    assert main(["suspects", str(bench), "--baseline", str(base_path)]) == 0
    assert capsys.readouterr().out == "suites/test_bench_x.py::kernel\n"


def test_the_pipeline_reruns_only_the_suspects_beside_the_results(tmp_path, monkeypatch):
    from harness.run import commands, pipeline

    steps = commands.plan("gpu_verify", python="py", leg="L", gpus=["0"], reports_dir=str(tmp_path), timeout=None)
    suites, bench = steps
    ran = []
    monkeypatch.setattr(pipeline, "_run", lambda name, argv, env, timings, ok=(0,): ran.append((name, argv, ok)) or 0)
    suspects = {bench.results_dir: ["suites/test_bench_x.py::kernel[a]", "suites/test_bench_x.py::kernel[b]"],
                suites.results_dir: ["suites/test_x.py::drifty"]}
    monkeypatch.setattr(pipeline, "suspected_regressions", lambda results_dir, baseline, python: (
        suspects.get(results_dir, []) if baseline else []))
    assert pipeline.confirm_suspects(steps, [], "base.json", []) == []  # no GPU: nothing at all
    assert pipeline.confirm_suspects(steps, ["0"], None, []) == []  # no baseline: nothing to confirm
    assert ran == []
    outs = pipeline.confirm_suspects(steps, ["0"], "base.json", [])
    assert outs == [suites.results_dir + "-confirm", bench.results_dir + "-confirm"]
    (s_name, s_argv, s_ok), (name, argv, ok) = ran
    assert (s_name, s_ok) == ("confirm suites", (0, 1))
    assert s_argv[s_argv.index("--results-dir") + 1] == outs[0] and "suites" not in s_argv
    assert "suites/test_x.py::drifty" in s_argv and "-n" in s_argv  # the suites' own workers and GPU pinning
    assert name == "confirm" and ok == (0, 1)
    assert argv[argv.index("--results-dir") + 1] == outs[1] and "suites" not in argv
    assert argv[:3] == bench.argv[:3] and argv[3:5] == ["suites/test_bench_x.py::kernel[a]",
                                                         "suites/test_bench_x.py::kernel[b]"]
    assert argv[5:] == [a if a != bench.results_dir else outs[1] for a in bench.argv[4:]]
    ran.clear()
    suspects[suites.results_dir] = []
    assert pipeline.confirm_suspects(steps, ["0"], "base.json", []) == [bench.results_dir + "-confirm"]
    assert [name for name, _, _ in ran] == ["confirm"]  # a step without suspects is not re-run


def _checked(case, err):
    """A suites record of a check with fresh random inputs and its worst error."""
    return rec("x", case, "passed", backend="triton", variant="v", device="cuda:0", metrics={"max_abs_err": err})


def test_a_grown_error_that_does_not_repeat_is_unconfirmed(tmp_path):
    """An error past twice the baseline's is a suspect; its re-run (fresh inputs) decides: back
    within the factor, unconfirmed; past it again, a regression."""
    from harness.report import summarize

    base = make_baseline(load_results([_run(tmp_path, "a", [_checked("drifty", 1e-4), _checked("lossy", 1e-4),
                                                            _checked("steady", 1e-4)])]))
    first = [_checked("drifty", 3e-4), _checked("lossy", 3e-4), _checked("steady", 1.1e-4)]
    alone = compare(load_results([_run(tmp_path, "gpu_verify-L", first)]), base)
    assert {f.case for f in alone.suspects()} == {"drifty", "lossy"}
    assert {(f.kind, f.confirmed) for f in alone.regressions} == {("error grew", None)}

    def judged(folder, rerun):
        results = load_results([_run(tmp_path / folder, "gpu_verify-L", first),
                                _run(tmp_path / folder, "gpu_verify-L-confirm", rerun)])
        return results, compare(results, base)

    results, comparison = judged("1", [_checked("drifty", 1.2e-4), _checked("lossy", 5e-4)])
    (unconfirmed,) = comparison.unconfirmed
    assert (unconfirmed.case, unconfirmed.confirmed) == ("drifty", False)
    assert "not repeated by its re-run (1.20e-04)" in unconfirmed.note
    (confirmed,) = comparison.regressions
    assert (confirmed.case, confirmed.kind, confirmed.confirmed) == ("lossy", "error grew", True)
    assert comparison.suspects() == [] and summarize(results, comparison).verdict == "REGRESSED"

    results, comparison = judged("2", [_checked("drifty", 1e-4), _checked("lossy", 1.5e-4)])
    assert comparison.regressions == [] and {f.case for f in comparison.unconfirmed} == {"drifty", "lossy"}
    assert summarize(results, comparison).verdict == "PASSED"

    _, comparison = judged("3", [_checked("drifty", float("nan"))])  # NaN grew; the lost case is unsettled
    assert {(f.case, f.confirmed) for f in comparison.regressions} == {("drifty", True), ("lossy", None)}


def test_confirmation_reruns_stay_out_of_the_history(tmp_path, private_history):
    from harness import history
    from harness.run.pipeline import record_history

    first = str(_run(tmp_path, "gpu_verify-L-bench", [_timed("t", 1.3, 0.005)]))
    rerun = str(_run(tmp_path, "gpu_verify-L-bench-confirm", [_timed("t", 1.0, 0.005)]))
    assert len(record_history([first, rerun], private_history)) == 1
    assert [r["run_id"].split("@")[1] for r in history.runs(private_history)] == ["gpu_verify-L-bench"]
