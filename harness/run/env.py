"""Environment capture for the run manifest: where and on what a run happened."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

# the optional distributions the suites and the peer comparison use (pyproject's transformers
# and peers extras): their versions go into the environment table, absent ones as None
OPTIONAL_DISTRIBUTIONS = ("transformers", "flashinfer-python", "flash-attn", "optimum-quanto", "hqq")


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    """The stripped stdout of ``cmd`` (bytes that are not UTF-8 replaced); None when it fails."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=10)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(root: str | os.PathLike | None = None) -> str | None:
    root = str(root or Path(__file__).resolve().parents[2])
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
    from kvbits._runtime import run_mode

    from .legs import stack_leg_name

    gpus = gpu_info()
    mode = run_mode()
    default_leg = stack_leg_name(torch.__version__, str(triton_version), gpu=mode == "gpu")
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
        "optional": optional_versions(),
        "gpus": gpus,
        "gpu": gpus[0]["name"] if gpus else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "commit": git_commit(),
        "ci": bool(os.environ.get("CI")),
    }


def capture_or_fallback(leg: str | None = None) -> dict:
    """:func:`capture`, or, should it fail, the leg and the reason (the manifest must still be
    written)."""
    try:
        return capture(leg)
    except Exception as exc:  # noqa: BLE001 - any failure of the capture is reported, not raised
        return {"leg": leg or os.environ.get("KVH_LEG") or "unknown", "mode": None,
                "capture_error": f"{type(exc).__name__}: {exc}"}


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (e.g. "flashinfer-python"; from its metadata,
    nothing imported), None if absent."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def optional_versions(dists=OPTIONAL_DISTRIBUTIONS) -> dict[str, str | None]:
    """:func:`dist_version` of each distribution in ``dists``."""
    return {dist: dist_version(dist) for dist in dists}


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


class BackgroundCapture:
    """:func:`capture` run in a child process, so that the caller neither imports torch nor
    touches CUDA (the controller of a run spread over GPUs: its workers start sooner).
    :meth:`result` waits for it; should the child fail, it captures in this process instead."""

    def __init__(self, leg: str | None = None, python: str = sys.executable) -> None:
        self.leg = leg
        from .subproc import env_with_repo

        env = env_with_repo()
        argv = [python, "-m", "harness.run.env", *(["--leg", leg] if leg else [])]
        self._result: dict | None = None
        try:
            self._proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
        except OSError:
            self._proc = None

    def ready(self) -> bool:
        return self._result is not None or self._proc is None or self._proc.poll() is not None

    def result(self) -> dict:
        if self._result is None:
            problem = "the capture process could not start"
            try:
                if self._proc is None:
                    raise ValueError(problem)
                out, err = self._proc.communicate(timeout=300)
                problem = (err.strip().splitlines() or [f"exit {self._proc.returncode}"])[-1]
                found = json.loads(out.strip().splitlines()[-1])
                if not isinstance(found, dict) or "mode" not in found:
                    raise ValueError("not a capture")
                self._result = found
            except (subprocess.SubprocessError, ValueError, IndexError):
                if self._proc is not None and self._proc.poll() is None:
                    self._proc.kill()
                    self._proc.wait()
                self._result = {**capture_or_fallback(self.leg), "capture_problem": problem}
        return self._result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.run.env", description="Print capture() as JSON.")
    parser.add_argument("--leg", default=None)
    args = parser.parse_args(argv)
    print(json.dumps(capture(args.leg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
