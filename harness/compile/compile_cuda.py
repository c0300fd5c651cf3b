"""Compile-check every ``kvbits/cuda/*.cu`` with ``nvcc``, with no GPU.

``python -m harness.compile.compile_cuda [--arch sm_90]`` compiles each source the way
``kvbits/cuda/loader.py`` builds it through ``load_inline`` (the command lines come
from :func:`harness.run.commands.nvcc_command`), against the torch headers of the running
interpreter (a CPU build of torch lacks one generated CUDA header: a shim stands in),
and prints ptxas's register / spill report. Exit status: 0 all compiled, 1 a source
failed, 2 no ``nvcc``. ``nox -s compile_matrix`` and the GPU scripts both call this.

A successful compile is remembered under ``$KVH_CACHE_DIR/nvcc`` (default
``~/.cache/kvbits/nvcc``), keyed by everything its result depends on: the source text, every
file beside it, the flags and the arch, nvcc's and the host compiler's releases, the
environment variables they read, the torch build whose headers it includes, the Python
headers and the shims. A second check of the same inputs (the next triton leg of ``nox -s tests``:
same sources, same torch) prints the remembered report marked ``cached``; any change compiles
again. ``--no-cache`` always compiles.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..run import commands

SOURCE_DIR = Path(__file__).resolve().parents[2] / "kvbits" / "cuda"


def include_dirs(scratch: Path) -> tuple[list[str], dict[str, str]]:
    """torch's and Python's include directories, plus shims (written under ``scratch``) for the
    headers a CPU torch lacks: (directories, the shims' texts by relative path)."""
    from torch.utils.cpp_extension import include_paths

    dirs = [*include_paths(), sysconfig.get_paths()["include"]]
    shims = commands.missing_header_shims(dirs)
    for rel, text in shims.items():
        (scratch / "shims" / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / "shims" / rel).write_text(text)
    return ([*dirs, str(scratch / "shims")] if shims else dirs), shims


def default_cache_dir() -> Path:
    return Path(os.environ.get("KVH_CACHE_DIR") or Path.home() / ".cache" / "kvbits") / "nvcc"


# Environment variables that nvcc or its host compiler read: each changes what a compile does.
COMPILER_ENV = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
                "CPLUS_INCLUDE_PATH", "NVCC_PROFILE")


def _version_text(cmd: list[str], run=subprocess.run) -> str:
    try:
        out = run([*cmd, "--version"], capture_output=True, text=True)
    except OSError as exc:
        return f"unavailable ({exc.__class__.__name__})"
    return out.stdout.strip() if out.returncode == 0 else f"unknown (exit {out.returncode})"


def _files_digest(directory: Path) -> str:
    """sha256 over every file beside the sources (headers a source may include, the loader)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def toolchain_identity(shims: dict[str, str], run=subprocess.run, environ=os.environ) -> dict:
    """What a compile's result depends on besides its source text and flags: nvcc's release and
    its host compiler's (nvcc calls ``$NVCC_CCBIN`` or the ``g++`` on PATH), the environment
    both read, the torch build whose headers are included (version and commit), the Python
    headers, the shims, and every file beside the sources."""
    import torch

    host = environ.get("NVCC_CCBIN") or shutil.which("g++", path=environ.get("PATH")) or "g++"
    return {"nvcc": _version_text(["nvcc"], run), "nvcc_path": shutil.which("nvcc", path=environ.get("PATH")),
            "host_compiler": [host, _version_text([host], run)],
            "env": {name: environ[name] for name in COMPILER_ENV if name in environ},
            "torch": torch.__version__, "torch_commit": getattr(torch.version, "git_version", None),
            "python_headers": [platform.python_version() + sys.abiflags, sysconfig.get_config_var("INCLUDEPY")],
            "shims": dict(sorted(shims.items())), "beside_sources": _files_digest(SOURCE_DIR)}


def cache_key(source_text: str, command: list[str], include_dirs: list[str], toolchain: dict) -> str:
    """sha256 over the source, the command (include directories by position: venvs differ in
    path, not in content, which ``toolchain`` pins) and the toolchain identity."""
    placeholders = {f"-I{d}": f"-I<include {i}>" for i, d in enumerate(include_dirs)}
    flags = [placeholders.get(arg, arg) for arg in command[:command.index("-c")]]
    blob = json.dumps({"source": source_text, "flags": flags, "toolchain": toolchain}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _remember(entry: Path, saved: dict) -> None:
    """Write a cache entry atomically; a cache that cannot be written costs only the recall."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(saved), encoding="utf-8")
        os.replace(tmp, entry)
    except OSError as exc:
        print(f"compile cache not written ({entry.parent}): {exc}", file=sys.stderr)


def compile_one(source: Path, arch: str, includes: list[str], scratch: Path, toolchain: dict,
                cache: Path | None, run=subprocess.run) -> tuple[bool, list[str]]:
    """Compile one source (or recall its identical earlier compile): (ok, lines to print)."""
    cmd = commands.nvcc_command(str(source), str(scratch / f"{source.stem}.o"), includes, arch=arch)
    key = cache_key(source.read_text(encoding="utf-8"), cmd, includes, toolchain)
    entry = cache / f"{key}.json" if cache is not None else None
    if entry is not None and entry.is_file():
        try:
            saved = json.loads(entry.read_text(encoding="utf-8"))
            return True, [f"ok   {arch} {source.name} (cached: the same inputs compiled {saved['compiled']})",
                          *[f"     {line}" for line in saved["report"]]]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: compile again
    result = run([*cmd, "-Xptxas", "-v"], capture_output=True, text=True)
    ok = result.returncode == 0
    lines = result.stderr.splitlines()
    report = [ln.strip() for ln in lines if "registers" in ln or "spill" in ln] if ok else lines[-25:]
    if ok and entry is not None:
        _remember(entry, {"source": source.name, "arch": arch, "report": report,
                          "compiled": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
    return ok, [f"{'ok  ' if ok else 'FAIL'} {arch} {source.name}", *[f"     {line}" for line in report]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=commands.NVCC_ARCH, help="nvcc -arch value (default %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="compile even what an identical compile passed")
    args = parser.parse_args(argv)
    sources = sorted(SOURCE_DIR.glob("*.cu"))
    if shutil.which("nvcc") is None:
        print(f"nvcc not found: {len(sources)} CUDA source(s) not compile-checked", file=sys.stderr)
        return 2
    cache = None if args.no_cache else default_cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        includes, shims = include_dirs(scratch)
        toolchain = toolchain_identity(shims)
        workers = max(1, min(len(sources), commands.usable_cpus()))
        with ThreadPoolExecutor(workers) as pool:  # nvcc runs in its own processes
            results = list(pool.map(lambda src: compile_one(src, args.arch, includes, scratch, toolchain, cache),
                                    sources))
    for _, lines in results:
        print("\n".join(lines))
    failures = sum(not ok for ok, _ in results)
    print(f"{failures} failure(s) in {len(sources)} source(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
