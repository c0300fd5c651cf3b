"""Environment capture for the run manifest: where and on what a run happened."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(root: str | os.PathLike | None = None) -> str | None:
    root = str(root or Path(__file__).resolve().parent.parent)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root):
        commit += "-dirty"
    return commit or os.environ.get("GITHUB_SHA")


def gpu_info() -> list[dict]:
    """One entry per visible CUDA device (empty without one)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return []
    if not torch.cuda.is_available():
        return []
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver = driver.splitlines()[0] if driver else None
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "sm_count": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                "driver": driver,
            }
        )
    return gpus


@lru_cache(maxsize=1)
def capture(leg: str | None = None) -> dict:
    """A JSON-ready description of this machine and software stack."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    from kernels._runtime import run_mode

    from .commands import installed_leg_name

    gpus = gpu_info()
    mode = run_mode()
    default_leg = installed_leg_name(torch.__version__, str(triton_version), gpu=mode == "gpu")
    return {
        "leg": leg or os.environ.get("KVH_LEG") or default_leg,
        "mode": mode,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "numpy": _version_of("numpy"),
        "nvcc": _nvcc_version(),
        "gpus": gpus,
        "gpu": gpus[0]["name"] if gpus else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "commit": git_commit(),
        "ci": bool(os.environ.get("CI")),
    }


def _version_of(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:  # pragma: no cover
        return None


def _nvcc_version() -> str | None:
    out = _run(["nvcc", "--version"])
    if not out:
        return None
    for line in out.splitlines():
        if "release" in line:
            return line.split("release")[-1].split(",")[0].strip()
    return None
