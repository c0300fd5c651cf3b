"""Compile-check every ``kernels/cuda/*.cu`` with ``nvcc``, with no GPU.

``python -m harness.compile_cuda [--arch sm_90]`` compiles each source the way
``kernels/cuda/loader.py`` builds it through ``load_inline`` (the command lines come
from :func:`harness.commands.nvcc_command`), against the torch headers of the running
interpreter (a CPU build of torch lacks one generated CUDA header: a shim stands in),
and prints ptxas's register / spill report. Exit status: 0 all compiled, 1 a source
failed, 2 no ``nvcc``. ``nox -s compile_matrix`` and the GPU scripts both call this.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from . import commands

SOURCE_DIR = Path(__file__).resolve().parent.parent / "kernels" / "cuda"


def include_dirs(scratch: Path) -> list[str]:
    """torch's and Python's include directories, plus shims for headers a CPU torch lacks."""
    from torch.utils.cpp_extension import include_paths

    dirs = [*include_paths(), sysconfig.get_paths()["include"]]
    shims = commands.missing_header_shims(dirs)
    for rel, text in shims.items():
        (scratch / "shims" / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / "shims" / rel).write_text(text)
    return [*dirs, str(scratch / "shims")] if shims else dirs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=commands.NVCC_ARCH, help="nvcc -arch value (default %(default)s)")
    args = parser.parse_args(argv)
    sources = sorted(SOURCE_DIR.glob("*.cu"))
    if shutil.which("nvcc") is None:
        print(f"nvcc not found: {len(sources)} CUDA source(s) not compile-checked", file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        includes = include_dirs(scratch)
        for source in sources:
            cmd = commands.nvcc_command(str(source), str(scratch / f"{source.stem}.o"), includes, arch=args.arch)
            result = subprocess.run([*cmd, "-Xptxas", "-v"], capture_output=True, text=True)
            ok = result.returncode == 0
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {args.arch} {source.name}")
            lines = result.stderr.splitlines()
            shown = [ln.strip() for ln in lines if "registers" in ln or "spill" in ln] if ok else lines[-25:]
            for line in shown:
                print(f"     {line}")
    print(f"{failures} failure(s) in {len(sources)} source(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
