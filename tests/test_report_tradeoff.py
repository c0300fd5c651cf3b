"""The accuracy/speed/memory section: points from the peers benchmark's records, the Pareto front,
the chart, the bytes-per-token table, and the page with and without them."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness.report import load_results, render_html, summarize
from harness.report.tradeoff import (
    MODEL,
    Point,
    memory_rows,
    method_rows,
    pareto_front,
    tradeoff_charts,
    tradeoff_points,
)
from harness.run import commands

GROUP = "B1-Hq32-Hkv32-S32768-D128"
ROOT = Path(__file__).resolve().parent.parent


def _method(name, ms, err, bits, bytes_per_token, *, group=GROUP, outcome="passed", **extra):
    return rec("bench_peers", f"test_bench_peer[{name}-{group}]", outcome, backend="peer", variant=name,
               device="cuda:0", metrics={"method": name, "ms": ms, "attn_rel_err": err, "bits": bits,
                                         "bytes_per_token": bytes_per_token, "pareto_group": group, **extra})


def _summary(tmp_path, records):
    return summarize(load_results([write_run(tmp_path / "gpu_verify-L-bench", records, leg="L",
                                             env=env_for("L", "gpu"))]))


# one layer of 32 kv heads of 128 at the benchmark's shape: fp16 is 16 bits an element
FP16 = 2 * 32 * 128 * 2
METHODS = [
    _method("sdpa-flash", 0.150, 1e-4, 16, FP16),
    _method("flashinfer-fp8", 0.090, 2e-2, 8, FP16 / 2),
    _method("kvbits-3bit", 0.047, 6e-2, 3, FP16 * 3.5 / 16),
    _method("kvbits-4bit", 0.052, 3e-2, 4, FP16 * 4.5 / 16),
    _method("hf-hqq-4", 0.900, 4e-2, 4, FP16 * 4.5 / 16),  # slower and less accurate than kvbits-4bit
]


def test_the_front_keeps_only_what_nothing_beats():
    points = [Point(m, 0, ms, err, None, GROUP) for m, ms, err in
              (("a", 1.0, 1.0), ("b", 2.0, 0.5), ("c", 3.0, 0.7), ("d", 0.5, 2.0), ("e", 2.0, 0.4))]
    assert [p.method for p in pareto_front(points)] == ["d", "a", "e"]  # b and c are beaten, e beats b at a tie
    assert pareto_front([]) == []


def test_points_come_from_passed_records_that_carry_the_fields(tmp_path):
    records = [*METHODS,
               _method("flex", 0.3, float("nan"), 16, FP16),  # no finite error: no point
               _method("flash-attn", 0.1, 1e-4, 16, FP16, outcome="failed"),
               rec("bench_decode", "test_bench_decode[x]", metrics={"ms": 0.04}),  # another benchmark
               _method("kvbits-3bit", 0.060, 7e-2, 3, FP16 * 3.5 / 16, group="B8-Hq32-Hkv8-S32768-D128",
                       attn_rel_err_outliers=0.2)]
    points = tradeoff_points(_summary(tmp_path, records))
    assert sorted(points) == ["B1-Hq32-Hkv32-S32768-D128", "B8-Hq32-Hkv8-S32768-D128"]
    assert [p.method for p in points[GROUP]] == [r.variant for r in METHODS]
    (gqa,) = points["B8-Hq32-Hkv8-S32768-D128"]
    assert gqa.error == 0.2  # the outlier-channel error is the chart's when recorded


def test_the_chart_names_every_method_and_the_front(tmp_path):
    (chart,) = tradeoff_charts(_summary(tmp_path, METHODS))
    svg = base64.b64decode(chart.uri.split(",", 1)[1]).decode()
    for record in METHODS:
        assert record.variant in svg
    assert chart.title == GROUP
    assert "Pareto front" in svg and "kvbits-3bit, kvbits-4bit, flashinfer-fp8, sdpa-flash" in chart.caption
    assert "hf-hqq-4" not in chart.caption


def test_steps_replayed_from_a_graph_are_drawn_beside_the_eager_ones(tmp_path):
    """A method with graph_ms gets a second, hollow point named in the legend and the caption; the
    front stays the eager steps'; without any graph_ms neither appears."""
    records = [*METHODS[:2], _method("kvbits-3bit", 0.047, 6e-2, 3, FP16 * 3.5 / 16, graph_ms=0.030),
               _method("kvbits-4bit", 0.052, 3e-2, 4, FP16 * 4.5 / 16, graph_ms=0.0)]  # 0: no point
    (chart,) = tradeoff_charts(_summary(tmp_path, records))
    svg = base64.b64decode(chart.uri.split(",", 1)[1]).decode()
    assert "replayed from a CUDA graph" in svg
    assert "CUDA graph (kvbits-3bit;" in chart.caption
    assert "on the Pareto front (nothing both faster and more accurate): kvbits-3bit, kvbits-4bit," in chart.caption
    points = tradeoff_points(_summary(tmp_path / "again", records))[GROUP]
    assert [p.graph_ms for p in points] == [None, None, 0.030, None]
    (plain,) = tradeoff_charts(_summary(tmp_path / "plain", METHODS))
    assert "CUDA graph" not in plain.caption
    assert "replayed from a CUDA graph" not in base64.b64decode(plain.uri.split(",", 1)[1]).decode()


def test_memory_rows_scale_a_layer_to_the_model(tmp_path):
    rows = {row["method"]: row for row in memory_rows(_summary(tmp_path, METHODS))}
    assert [r["method"] for r in memory_rows(_summary(tmp_path / "2", METHODS))][0] == "kvbits-3bit"
    assert rows["sdpa-flash"]["bits_per_element"] == "16.00"
    per_token = 2 * MODEL["layers"] * MODEL["kv_heads"] * MODEL["head_dim"] * 2
    assert rows["sdpa-flash"]["bytes_per_token"] == f"{per_token:,}"
    assert rows["sdpa-flash"]["contexts"][0] == f"{int((80 - MODEL['weights_gb']) * 1e9 // per_token):,}"
    assert rows["kvbits-3bit"]["bits_per_element"] == "3.50"
    three_bit = int(rows["kvbits-3bit"]["contexts"][1].replace(",", ""))
    assert three_bit == pytest.approx(int(rows["sdpa-flash"]["contexts"][1].replace(",", "")) * 16 / 3.5, rel=1e-6)


def test_the_page_shows_the_section_only_with_points(tmp_path):
    html = render_html(_summary(tmp_path, METHODS), history=None)
    assert 'id="charts-tradeoff"' in html and 'id="memory-per-token"' in html and "kvbits-3bit" in html
    plain = render_html(_summary(tmp_path / "plain", [rec("bench_decode", "t", metrics={"ms": 0.04})]), history=None)
    assert 'id="charts-tradeoff"' not in plain and 'id="memory-per-token"' not in plain


def test_the_peers_benchmark_feeds_the_section(tmp_path):
    """The peers benchmark run on CPU as ``nox -s peers`` selects it (the bench step's pytest command,
    ``-m peers`` after its ``-m bench``): only the peers cases run (the decode-step benchmark beside
    them is deselected), each method passes or is skipped naming why, and the records of the
    methods that ran are the section's points, kvbits among them, with their bytes per token.
    FlexAttention and transformers' caches are left out: seconds each on CPU where installed."""
    from suites.peers_support import METHODS

    out = tmp_path / "bench-L"
    argv = commands.pytest_command(sys.executable, ["suites/test_bench_peers.py", "suites/test_bench_decode_step.py"],
                                   marker="bench", results_dir=str(out), leg="L",
                                   extra=["-m", "peers", "-k", "not flex and not hf-", "-p", "no:cacheprovider"])
    run = subprocess.run(argv, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = summarize(load_results([out]))
    every = {record.variant: record for _, record in summary.results.pairs()}
    records = {name: r for name, r in every.items() if not name.startswith(("serving-", "activations-"))}
    assert sorted(records) == sorted(m for m in METHODS if m != "flex" and not m.startswith("hf-"))
    assert {r.suite for r in every.values()} == {"bench_peers"}
    ran = sorted(name for name, r in records.items() if r.outcome == "passed")
    assert {"kvbits2", "kvbits3", "kvbits4", "sdpa-math"} <= set(ran)
    for name, record in every.items():
        assert record.outcome in ("passed", "skipped"), (name, record.message)
        method = name.removeprefix("serving-").removeprefix("activations-")
        assert record.outcome == "passed" or record.message.startswith(f"{method}: "), (name, record.message)
    assert "needs a CUDA device" in records["sdpa-flash"].message
    assert records["sdpa-math"].metrics["reference"] is True and records["kvbits3"].metrics["reference"] is False
    ((group, points),) = tradeoff_points(summary).items()
    assert group == "B1-Hq2-Hkv2-S256-D64"
    assert sorted(p.method for p in points) == ran
    rows = {row["method"]: row for row in memory_rows(summary)}
    assert rows["kvbits3"]["bits_per_element"] == "3.50" and rows["sdpa-math"]["bits_per_element"] == "16.00"
    # the serving batch ran kvbits and SDPA's math backend; flash-attn has no server and says why
    served = {row["method"]: row for row in method_rows(summary) if row["serving"]}
    assert {"kvbits2", "kvbits3", "kvbits4", "sdpa-math"} <= set(served)
    assert "no ragged adapter" in every["serving-flash-attn"].message
    if every["activations-kvbits3"].outcome == "passed":  # the accuracy suite's model is installed
        assert float(every["activations-kvbits3"].metrics["attn_rel_err_real"]) < 0.5


def _serving(name, tokens_per_s, nbytes):
    return rec("bench_peers", f"test_bench_peer_serving[{name}]", backend="peer", variant=f"serving-{name}",
               device="cuda:0", metrics={"method": name, "tokens_per_s": tokens_per_s, "ms": 0.25, "p99_ms": 0.5,
                                         "nbytes": nbytes})


def _real(name, err, worst):
    return rec("bench_peers", f"test_peer_error_on_activations[{name}]", backend="peer",
               variant=f"activations-{name}", device="cuda:0",
               metrics={"method": name, "attn_rel_err_real": err, "attn_rel_err_real_max": worst})


def test_serving_and_real_error_rows(tmp_path):
    records = [*METHODS, _serving("sdpa-flash", 10_000.0, 4.4e9), _serving("kvbits3", 130_000.0, 1.1e9),
               _real("kvbits3", 0.2, 0.32), _real("hf-hqq-4", 0.165, 0.21),
               rec("bench_peers", "test_bench_peer_serving[flex]", "skipped", backend="peer",
                   variant="serving-flex", device="cuda:0", metrics={})]
    rows = method_rows(_summary(tmp_path, records))
    assert [r["method"] for r in rows] == ["kvbits3", "sdpa-flash", "hf-hqq-4"]  # servers, fastest first
    kv, fp16, hqq = rows
    assert kv["serving"] == "130,000" and kv["gb"] == "1.10" and kv["real"] == "0.200" and kv["real_max"] == "0.320"
    assert fp16["serving"] == "10,000" and fp16["real"] == ""
    assert hqq["real"] == "0.165" and hqq["serving"] == ""
    html = render_html(_summary(tmp_path, records))
    assert 'id="serving-and-real-error"' in html and "130,000" in html
    assert method_rows(_summary(tmp_path / "timing-only", METHODS)) == []  # the timing records alone make no row
