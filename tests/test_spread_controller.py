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

from harness.run import env as harness_env

ROOT = Path(__file__).resolve().parents[1]

CONTROLLER = textwrap.dedent("""
    import json, sys, pytest
    leg = ["--leg", sys.argv[2]] if sys.argv[2] else []
    rc = pytest.main(["-p", "harness.run.gpu_workers", "suites/test_golden.py", *sys.argv[3:], "-q",
                      "-p", "no:cacheprovider", "--results-dir", sys.argv[1], *leg])
    print(json.dumps({"rc": int(rc), "torch_in_controller": "torch" in sys.modules}))
""")


def _spread_run(tmp_path, leg: str, *args: str) -> tuple[dict, dict]:
    """suites/test_golden.py run as gpu_verify runs its suites (KVH_GPUS set), with a device entry
    that hides every GPU and a scratch extension root; the result and the manifest."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(KVH_GPUS="-1", KVH_EXT_DIR=str(tmp_path / "ext"), PYTHONPATH=str(ROOT))
    results = tmp_path / "results"
    out = subprocess.run([sys.executable, "-c", CONTROLLER, str(results), leg, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = json.loads((results / "manifest.json").read_text())
    records = [json.loads(line) for line in (results / "records.jsonl").read_text().splitlines()]
    assert records and {r["outcome"] for r in records} == {"passed"}
    assert manifest["complete"] and manifest["env"]["torch"]
    assert manifest["mode"] == manifest["env"]["mode"] and manifest["leg"] == manifest["env"]["leg"]
    return json.loads(out.stdout.strip().splitlines()[-1]), manifest


def test_spread_controller_leaves_torch_to_its_workers(tmp_path):
    pytest.importorskip("xdist")
    result, manifest = _spread_run(tmp_path, "spread-leg", "-n", "2")
    assert result == {"rc": 0, "torch_in_controller": False}
    assert manifest["leg"] == "spread-leg" and "capture_problem" not in manifest["env"]


@pytest.mark.parametrize("args", [("-n", "2"), ()], ids=["xdist", "no-xdist"])
def test_spread_run_without_a_leg_names_it_from_the_environment(tmp_path, args):
    """Without --leg the leg comes from torch and triton: the controller captures in process."""
    if args:
        pytest.importorskip("xdist")
    result, manifest = _spread_run(tmp_path, "", *args)
    assert result["rc"] == 0
    assert manifest["leg"].startswith(("cpu-torch", "gpu-torch"))


def test_background_capture_matches_capture_in_process():
    pending = harness_env.BackgroundCapture("some-leg")
    found = pending.result()
    here = harness_env.capture("some-leg")
    assert pending.ready()
    assert {k: found[k] for k in ("leg", "mode", "torch", "triton", "python")} == {
        k: here[k] for k in ("leg", "mode", "torch", "triton", "python")}


def test_background_capture_falls_back_to_this_process(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho not-json\necho the capture broke >&2\n")
    broken.chmod(0o755)
    found = harness_env.BackgroundCapture("L", python=str(broken)).result()
    assert found["leg"] == "L" and found["mode"] and found["capture_problem"] == "the capture broke"
    missing = harness_env.BackgroundCapture("L", python=str(tmp_path / "missing")).result()
    assert missing["leg"] == "L" and missing["capture_problem"] == "the capture process could not start"


COUNTING = textwrap.dedent("""
    import pytest
    from harness.compile import triton_cache

    @pytest.mark.parametrize("n", range(5))
    def test_compiles(n):
        triton_cache.STATS["stored"] += 1
        triton_cache.STATS["loaded_after_wait"] += 2
""")


def test_workers_compile_counts_are_summed_into_the_manifest(tmp_path):
    """Each worker hands the compile counts of harness/compile/triton_cache.py to the controller."""
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
