"""The one loader for every CUDA / C++ source in ``kvbits/cuda/``, through ``load_inline``.

``load_extension("pack3", functions=[...], declarations=...)`` reads
``kvbits/cuda/pack3.cu``, names the extension after a hash of the source, the
flags and the torch version (so an edited source never reuses a stale build),
and builds it in a directory per ``CUDA_VISIBLE_DEVICES`` choice (``harness.run.gpu_workers``
gives each GPU a build root of its own). Processes that share a directory (several
pytest-xdist workers on one GPU, the benchmarks after them) take turns under an OS file
lock: the first builds, the others load what it built; a build whose owner was killed
(a per-test timeout) is waited out before the next one starts. Built modules are cached
per process.

Environment: ``KVH_EXT_DIR`` moves the build root (default
``~/.cache/kvbits/torch_extensions``); ``KVH_CUDA_ARCH`` overrides the target
architecture list (default: the current device's, e.g. ``9.0``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_cache: dict[str, object] = {}


def source_path(stem: str) -> Path:
    for suffix in (".cu", ".cpp"):
        path = SOURCE_DIR / f"{stem}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"no source kvbits/cuda/{stem}.cu or .cpp")


def extension_name(stem: str, source: str, flags: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(flags), torch.__version__, str(torch.version.cuda)):
        digest.update(part.encode())
    return f"kvh_{stem}_{digest.hexdigest()[:16]}"


def build_dir_for(name: str) -> Path:
    """The build directory of extension ``name`` for this process's device set; processes that
    share it are serialized by :func:`_exclusive`."""
    root = Path(os.environ.get("KVH_EXT_DIR", Path.home() / ".cache" / "kvbits" / "torch_extensions"))
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "none"
    path = root / name / f"dev{devices}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_extension(
    stem: str,
    *,
    functions: list[str],
    declarations: str,
    cuda: bool | None = None,
    extra_cflags: list[str] | None = None,
    extra_cuda_cflags: list[str] | None = None,
    extra_ldflags: list[str] | None = None,
    verbose: bool = False,
    source_text: str | None = None,
):
    """Build (or reuse) the extension for ``kvbits/cuda/<stem>.cu|.cpp``.

    ``declarations`` are the C++ prototypes of ``functions`` (what pybind binds);
    the source defines them. ``.cu`` sources need a CUDA build of torch and a GPU.
    ``source_text``: build this CUDA source instead of a file (experiments, e.g. the
    launch-shape sweeps under ``scripts/``), named ``stem``.
    """
    if source_text is None:
        path = source_path(stem)
        source = path.read_text()
        is_cuda = path.suffix == ".cu" if cuda is None else cuda
    else:
        source = source_text
        is_cuda = True if cuda is None else cuda
    name_of = f"kvbits/cuda/{stem}" if source_text is None else f"{stem} (source text)"
    if is_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"{name_of} needs a CUDA device and a CUDA build of torch")
    cflags = ["-O3", *(extra_cflags or [])]
    cuda_flags = ["-O3", "--use_fast_math", "-lineinfo", *(extra_cuda_cflags or [])] if is_cuda else []
    name = extension_name(stem, declarations + source, cflags + cuda_flags + (extra_ldflags or []))
    with _lock:
        if name in _cache:
            return _cache[name]
        if is_cuda and "TORCH_CUDA_ARCH_LIST" not in os.environ:
            arch = os.environ.get("KVH_CUDA_ARCH")
            if not arch:
                major, minor = torch.cuda.get_device_capability()
                arch = f"{major}.{minor}"
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch
        build_dir = build_dir_for(name)
        with _exclusive(build_dir):
            module = _build(name, declarations, source, functions, cflags, cuda_flags, extra_ldflags,
                            build_dir, is_cuda, verbose)
        _cache[name] = module
        return module


ORPHAN_WAIT_S = 600.0  # how long to wait for a killed build's compiler processes to end


def processes_working_in(directory: Path, proc: Path = Path("/proc")) -> list[int]:
    """Pids (other than this process) whose working directory is ``directory``: the ninja and
    compiler processes of a build whose Python owner was killed (torch runs ninja there). Empty
    where /proc is not readable."""
    target = os.path.realpath(directory)
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.path.realpath(entry / "cwd") == target:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def _exclusive(build_dir: Path, wait_s: float = ORPHAN_WAIT_S):
    """Hold an OS file lock on ``build_dir`` (released when its process dies, unlike torch's
    own ``lock`` file). While held, the directory's only possible users are the orphaned
    ninja/compiler processes of a killed holder: wait for them to end (at most ``wait_s``),
    then a ``lock`` file left behind is stale: removed."""
    with open(build_dir / ".kvh-build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            deadline = time.monotonic() + wait_s
            while processes_working_in(build_dir) and time.monotonic() < deadline:
                time.sleep(0.5)
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(name, declarations, source, functions, cflags, cuda_flags, extra_ldflags, build_dir, is_cuda,
           verbose):
    from torch.utils.cpp_extension import load_inline

    common = {"name": name, "functions": functions, "extra_cflags": cflags, "extra_ldflags": extra_ldflags,
              "build_directory": str(build_dir), "verbose": verbose}
    if is_cuda:
        return load_inline(cpp_sources=[declarations], cuda_sources=[source],
                           extra_cuda_cflags=cuda_flags or None, **common)
    return load_inline(cpp_sources=[declarations + "\n" + source], **common)
