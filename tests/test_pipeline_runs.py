"""The pipeline's main loop on a pretend GPU, its pytest and report commands stubbed: what the
report is given (run directories, baseline) and what the pipeline says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import env_for, rec, write_run

from harness.run import pipeline

INSTALLED = "gpu-torch2.11.0+cu130-triton3.6.0"  # the leg name with the installed build's local label
PINNED = "gpu-torch2.11.0-triton3.6.0"  # the same stack as a GPU leg (and the installed build) names it


@pytest.fixture
def rendered(tmp_path, monkeypatch) -> list[dict]:
    """Each pytest step writes one passing record into its results directory; each report step
    is noted (its run directories and baseline) instead of run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVH_BASELINE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pipeline, "probe", lambda python, env=None: {
        "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "count": 1, "names": ["NVIDIA H200"]})

    def run(name, argv, env, timings, ok=(0,)):
        out = Path(argv[argv.index("--results-dir") + 1])
        write_run(out, [rec(name, "test_one", device="cuda:0")], leg=INSTALLED, env=env_for(INSTALLED, "gpu"))
        timings.append({"step": name, "rc": 0, "ok": True, "seconds": 0.0, "argv": list(argv)})
        return 0

    calls: list[dict] = []

    def render(run_dirs, reports_dir, baseline, timings, python=None, steps=None, family="all"):
        calls.append({"run_dirs": list(run_dirs), "baseline": baseline})
        return 0

    monkeypatch.setattr(pipeline, "_run", run)
    monkeypatch.setattr(pipeline, "render", render)
    return calls


def test_no_bench_leaves_no_earlier_benchmarks_in_the_report(rendered):
    assert pipeline.main(["gpu_verify"]) == 0
    suites, bench = f"reports/runs/gpu_verify-{PINNED}", f"reports/runs/gpu_verify-{PINNED}-bench"
    assert rendered[-1]["run_dirs"] == [suites, bench]
    assert pipeline.main(["gpu_verify", "--no-bench"]) == 0
    assert rendered[-1]["run_dirs"] == [suites]
    assert not Path(bench).exists()


def test_a_gpu_run_goes_into_the_run_history(rendered, private_history, capsys):
    from harness import history

    assert pipeline.main(["gpu_verify"]) == 0
    assert "history: 2 run(s) added" in capsys.readouterr().out
    assert {r["leg"] for r in history.runs(private_history)} == {INSTALLED}
    assert len(history.runs(private_history)) == 2  # the suites and the benchmarks


def test_a_leg_without_a_baseline_says_so(rendered, capsys):
    assert pipeline.main(["gpu_verify", "--leg", PINNED]) == 0
    assert rendered[-1]["baseline"] is None
    said = [line for line in capsys.readouterr().out.splitlines() if "no baseline" in line]
    assert len(said) == 1 and PINNED in said[0]


def test_a_leg_finds_its_baseline_named_with_the_local_torch_label(rendered, capsys):
    folder = Path("reports/baselines")
    folder.mkdir(parents=True)
    (folder / f"{INSTALLED}.json").write_text(json.dumps({"format": "kvh-baseline", "version": 1, "cases": {}}))
    (folder / "packing-h200.json").write_text(json.dumps({"date": "2026-11-30", "copy_gbps": 4270.9}))
    assert pipeline.main(["gpu_verify", "--leg", PINNED]) == 0
    assert rendered[-1]["baseline"] == str(folder / f"{INSTALLED}.json")
    assert "no baseline" not in capsys.readouterr().out
