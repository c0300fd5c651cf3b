"""Compile-check every ``.cu`` source in ``kernels/cuda/`` with ``nvcc``, with no GPU.

``python -m kernels.cuda.compile_check --arch 90`` compiles each source to an
object file against torch's headers (a CPU build of torch lacks one generated
CUDA header; a shim provides it), printing the register and spill report.
Exit status 1 when any source fails, 2 when ``nvcc`` is absent.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from .loader import SOURCE_DIR

_SHIM = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"


def nvcc_command(source: Path, arch: int, out: Path, shim_dir: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{shim_dir}", *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}"]
    return [
        "nvcc", f"-arch=sm_{arch}", "-std=c++20", "-O3", "-c", str(source), "-o", str(out),
        "-Xptxas", "-v", "-diag-suppress", "3306", *includes,
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90])
    args = parser.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("nvcc not found: CUDA sources not compile-checked", file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        shim = Path(tmp) / "shim"
        (shim / "c10" / "cuda" / "impl").mkdir(parents=True)
        (shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(_SHIM)
        for source in sorted(SOURCE_DIR.glob("*.cu")):
            for arch in args.arch:
                result = subprocess.run(
                    nvcc_command(source, arch, Path(tmp) / f"{source.stem}.o", shim), capture_output=True, text=True
                )
                ok = result.returncode == 0
                failures += not ok
                usage = [ln.strip() for ln in result.stderr.splitlines() if "registers" in ln or "spill" in ln]
                print(f"{'ok  ' if ok else 'FAIL'} sm_{arch} {source.name}")
                for line in usage if ok else result.stderr.splitlines()[-20:]:
                    print(f"     {line}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
