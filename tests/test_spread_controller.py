"""The controller of a run spread over GPUs imports no torch (its workers start sooner) and
still writes the run's environment into the manifest, from a capture in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import env as harness_env

ROOT = Path(__file__).resolve().parents[1]

CONTROLLER = textwrap.dedent("""
    import json, sys, pytest
    rc = pytest.main(["-p", "harness.gpu_workers", "suites/test_golden.py", "-n", "2", "-q",
                      "-p", "no:cacheprovider", "--results-dir", sys.argv[1], "--leg", "spread-leg"])
    print(json.dumps({"rc": int(rc), "torch_in_controller": "torch" in sys.modules}))
""")


def test_spread_controller_leaves_torch_to_its_workers(tmp_path):
    pytest.importorskip("xdist")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(KVH_GPUS="0", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CONTROLLER, str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "torch_in_controller": False}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] and manifest["leg"] == "spread-leg"
    assert manifest["env"]["torch"] and manifest["env"]["leg"] == "spread-leg"
    assert manifest["mode"] == manifest["env"]["mode"]
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert records and {r["outcome"] for r in records} == {"passed"}


def test_background_capture_matches_capture_in_process():
    pending = harness_env.BackgroundCapture("some-leg")
    found = pending.result()
    here = harness_env.capture("some-leg")
    assert pending.ready()
    assert {k: found[k] for k in ("leg", "mode", "torch", "triton", "python")} == {
        k: here[k] for k in ("leg", "mode", "torch", "triton", "python")}


def test_background_capture_falls_back_to_this_process(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho not-json\n")
    broken.chmod(0o755)
    assert harness_env.BackgroundCapture("L", python=str(broken)).result()["leg"] == "L"
    assert harness_env.BackgroundCapture("L", python=str(tmp_path / "missing")).result()["leg"] == "L"


COUNTING = textwrap.dedent("""
    import pytest
    from harness import triton_cache

    @pytest.mark.parametrize("n", range(5))
    def test_compiles(n):
        triton_cache.STATS["stored"] += 1
        triton_cache.STATS["loaded_after_wait"] += 2
""")


def test_workers_compile_counts_are_summed_into_the_manifest(tmp_path):
    """Each worker hands the compile counts of harness/triton_cache.py to the controller."""
    pytest.importorskip("xdist")
    (tmp_path / "test_counting.py").write_text(COUNTING)
    results = tmp_path / "results"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "-n", "2", "-q",
                          "-p", "no:cacheprovider", "--results-dir", str(results), "test_counting.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest["triton_compiles"] == {"stored": 5, "loaded_after_wait": 10}
