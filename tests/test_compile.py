"""Every kernel builds for the GPU, checked with no GPU on every interpreter leg.

The Triton interpreter accepts kernels that the compiler rejects, so each leg (each
triton release) also compiles every Triton kernel ahead of time for sm_90, and compiles
every CUDA source with nvcc where nvcc exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_every_triton_kernel_compiles_for_sm90(record):
    result = _run("-m", "kernels.aot", "--arch", "90")
    lines = result.stdout.splitlines()
    compiled = sum(" ok " in line for line in lines)
    failed = [line for line in lines if "FAIL" in line]
    record.backend, record.variant = "triton", "aot-sm_90"
    record.add(states_checked=compiled, kernels_failed=len(failed))
    assert result.returncode == 0, "\n".join(failed) or result.stderr[-3000:]
    assert compiled >= 60, f"only {compiled} specializations compiled:\n{result.stdout[-2000:]}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_every_cuda_source_compiles_with_nvcc(record):
    result = _run("-m", "harness.compile_cuda")
    record.backend, record.variant = "cuda", "nvcc-sm_90"
    record.add(states_checked=result.stdout.count("\nok ") + result.stdout.startswith("ok "))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
