"""kvbits harness sessions. Version legs: harness/run/legs.py; command lines: harness/run/commands.py.
Suites run through harness/run/pipeline.py (also `python -m harness.gpu_verify` without nox).
`--no-venv`: the installed torch/triton, nothing installed. More: docs/sessions.md.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox
import nox.sessions
import nox.virtualenv
from nox.command import CommandFailed

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from harness.run import commands, pip_settings  # noqa: E402
from harness.run.legs import (  # noqa: E402
    CPU_TORCH,
    GPU_LEGS,
    INTERPRETER_LEGS,
    compile_triton_versions,
    gpu_leg,
    interpreter_leg,
    interpreter_leg_for,
)

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_venv = "yes"

GPU_PARAMS = [(leg.torch, leg.triton) for leg in GPU_LEGS]
EXTRAS = nox.project.load_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]
REPORT_DEPS = EXTRAS["report"] + EXTRAS["history"]  # the report reads the run history
# peers that build CUDA kernels from source for tens of minutes where no wheel matches the
# installed torch: the peers session takes them from a wheel or not at all
WHEEL_ONLY_PEERS = ("flash-attn",)
_RAN_INSTALLED: set[str] = set()


def _installed(session: nox.Session) -> bool:
    """True under ``--no-venv`` (or a session without a virtualenv)."""
    return session.venv_backend == "none"


def _python(session: nox.Session) -> str:
    return sys.executable if _installed(session) else "python"


def _once_on_installed(session: nox.Session, family: str) -> None:
    """Without virtualenvs every leg of ``family`` would test the same installed stack: once is enough."""
    if family in _RAN_INSTALLED:
        session.skip(f"--no-venv: {family} already ran on the installed torch/triton")
    _RAN_INSTALLED.add(family)


def _install_stack(session: nox.Session, torch: str, triton: str | None, index_url: str | None = None,
                   extras: str | None = commands.PROJECT_EXTRAS) -> None:
    if _installed(session):
        session.log("--no-venv: using the installed torch and triton; nothing is installed")
        return
    index_url = index_url or os.environ.get("KVH_TORCH_INDEX_URL")  # a GPU leg keeps its CUDA index
    for args in commands.install_commands(torch, triton, index_url=index_url, extras=extras):
        session.install(*args)


def _drop_venv_when_asked(session: nox.Session) -> None:
    """Under ``KVH_DROP_LEG_VENVS=1`` a leg's virtualenv (about 2.5 GB: torch, one triton, the extras) is
    removed once the leg has run, so the legs of one run need one leg's disk, not all of them together."""
    if os.environ.get("KVH_DROP_LEG_VENVS") != "1" or _installed(session):
        return
    location = Path(session.virtualenv.location).resolve()
    if location.parent != (ROOT / ".nox").resolve():
        session.warn(f"KVH_DROP_LEG_VENVS: {location} is not under .nox/; left in place")
        return
    shutil.rmtree(location, ignore_errors=True)
    if location.exists():
        session.warn(f"KVH_DROP_LEG_VENVS: {location.name} could not be removed whole")
    else:
        session.log(f"KVH_DROP_LEG_VENVS: removed {location.name}")


def _default_stack() -> tuple[str, str | None]:
    """torch ``KVH_TORCH`` (default the CPU legs' torch) and triton ``KVH_TRITON``; unset, the
    triton torch pins where a GPU runs the kernels, and without one that of the leg plain
    ``nox -s tests`` runs, since the kernels run in the interpreter just as that leg's do."""
    triton = os.environ.get("KVH_TRITON") or (None if _has_gpu() else _default_triton())
    return os.environ.get("KVH_TORCH", CPU_TORCH), triton


def _install_default_stack(session: nox.Session, *, share: bool = True) -> None:
    """The stack of the sessions that run on this machine's device (:func:`_default_stack`) with
    the project, in the virtualenv of the ``tests`` leg of the same pins when there is one
    (:func:`_share_leg_venv`; not with ``share=False``, for a session that adds packages)."""
    torch, triton = _default_stack()
    leg = interpreter_leg_for(torch, triton)
    if share and leg is not None and not _installed(session):
        _share_leg_venv(session, leg)
    _install_stack(session, torch, triton)


def _share_leg_venv(session: nox.Session, leg) -> None:
    """Go on in the virtualenv of the ``tests`` session of ``leg``: it holds the very packages this
    session installs (torch, triton, the project and its extras, about 2.5 GB), so ``verify`` then
    ``tests`` need one of them, not two. nox keys each virtualenv by its session's name and has no
    option to share one, so the session's runner is pointed at the leg's, created or reused as nox
    does it, and the session's own (empty) virtualenv is removed. A backend other than
    virtualenv/venv/uv, or a nox without these attributes, keeps the session's own."""
    runner = getattr(session, "_runner", None)
    own = getattr(runner, "venv", None)
    envdir = getattr(getattr(runner, "global_config", None), "envdir", None)
    if not isinstance(own, nox.virtualenv.VirtualEnv) or envdir is None:
        return
    location = nox.sessions._normalize_path(os.fspath(envdir), leg.session)
    if Path(location).resolve() == Path(own.location).resolve():
        return
    shared = nox.virtualenv.VirtualEnv(location, own.interpreter, reuse_existing=own.reuse_existing,
                                       venv_backend=own.venv_backend, venv_params=own.venv_params,
                                       download_python=own.download_python)
    shared.create()
    shared.env["NOX_CURRENT_SESSION"] = own.env.get("NOX_CURRENT_SESSION")
    runner.venv = shared
    if Path(own.location).resolve().parent == (ROOT / ".nox").resolve():
        shutil.rmtree(own.location, ignore_errors=True)
    session.log(f"{session.name} installs what {leg.session} does: it runs in that session's virtualenv, "
                f"{Path(location).name}")


def _pipeline(session: nox.Session, kind: str, *args: str) -> None:
    session.run(_python(session), "-m", "harness.run.pipeline", kind, *args, external=_installed(session))


def _has_gpu() -> bool:
    """Whether nvidia-smi lists a GPU (torch need not be installed)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and "GPU" in out.stdout


def _require_cuda_driver(session: nox.Session) -> None:
    """Refuse before installing gigabytes of CUDA wheels on a machine without a GPU."""
    if not _has_gpu():
        session.error("gpu_verify needs a CUDA device, and nvidia-smi finds none: nothing was installed "
                      "or run. `nox -s verify` or `nox -s tests` run in the Triton interpreter on CPU.")


ALL_LEGS = "--all-legs"  # `nox -s tests -- --all-legs`: every interpreter leg (CI's command)


def _default_triton() -> str:
    """The leg plain ``nox -s tests`` runs: the triton installed beside nox when it is a leg,
    else the newest leg."""
    legs = [leg.triton for leg in INTERPRETER_LEGS]
    try:
        installed = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    return installed if installed in legs else max(legs, key=lambda v: tuple(int(p) for p in v.split(".")))


def _named_alone(session: nox.Session) -> bool:
    """Whether this leg was picked by its own id (``nox -s "tests(triton='3.4.0')"``) or by a
    keyword (``-k``), not by the bare name ``tests`` or plain ``nox``. A session not started by
    nox's command line (no runner to ask) counts as named."""
    config = getattr(getattr(session, "_runner", None), "global_config", None)
    if config is None:
        return True
    if getattr(config, "keywords", None):
        return True
    own = session.name.replace(" ", "").replace('"', "'")
    return any(str(name).replace(" ", "").replace('"', "'") == own for name in getattr(config, "sessions", None) or ())


@nox.session
@nox.parametrize("triton", [leg.triton for leg in INTERPRETER_LEGS])
def tests(session: nox.Session, triton: str) -> None:
    """Unit tests and every suite in the Triton interpreter on CPU; one leg (-- --all-legs: every leg)."""
    leg = interpreter_leg(triton)
    posargs = [arg for arg in session.posargs if arg != ALL_LEGS]
    if ALL_LEGS not in session.posargs and triton != _default_triton() and not _named_alone(session):
        session.skip(f"one leg by default (triton {_default_triton()}); every leg: nox -s tests -- {ALL_LEGS}")
    if _installed(session):
        _once_on_installed(session, "tests")
        _pipeline(session, "tests", *posargs)
        return
    try:
        _install_stack(session, leg.torch, leg.triton)
        _pipeline(session, "tests", "--leg", leg.name, *posargs)
    finally:
        _drop_venv_when_asked(session)


@nox.session(default=False)
def verify(session: nox.Session) -> None:
    """The main job on this machine's device: suites (and benchmarks on a GPU), then the report."""
    _install_default_stack(session)
    _pipeline(session, "verify", *session.posargs)


@nox.session(default=False)
@nox.parametrize(("torch", "triton"), GPU_PARAMS)
def gpu_verify(session: nox.Session, torch: str, triton: str) -> None:
    """Suites over every GPU (one pinned xdist worker each), benchmarks, report; refuses without CUDA."""
    leg = gpu_leg(torch, triton)
    posargs = list(session.posargs)
    installed = _installed(session) or "--installed" in posargs
    posargs = [arg for arg in posargs if arg != "--installed"]
    if installed:
        _once_on_installed(session, "gpu_verify")
        session.run(sys.executable, "-m", "harness.gpu_verify", *posargs, external=True)
        return
    _require_cuda_driver(session)
    _install_stack(session, leg.torch, leg.triton, leg.torch_index_url)
    _pipeline(session, "gpu_verify", "--leg", leg.name, *posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks alone, serially, on this machine's device, then the report."""
    _install_default_stack(session)
    _pipeline(session, "bench", *session.posargs)


PEERS_MARKER = "peers"  # the peer comparison's cases (suites/test_bench_peers.py)


@nox.session(default=False)
def peers(session: nox.Session) -> None:
    """The peer comparison alone: kvbits against harness/peers (bench cases marked peers), report."""
    _install_default_stack(session, share=False)  # the peers' packages go in beside it
    _install_peers(session)
    # the bench step selects -m bench; a later -m replaces it in pytest, and posargs come after
    _pipeline(session, "bench", "-m", PEERS_MARKER, *session.posargs)


def _install_peers(session: nox.Session) -> None:
    """Each package of the ``peers`` extra that installs here, one at a time (WHEEL_ONLY_PEERS
    from a wheel only): one that does not is said, and its peer's cases skip, naming it."""
    if _installed(session):
        return
    for requirement in EXTRAS["peers"]:
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        try:
            session.install(*([f"--only-binary={name}"] if name in WHEEL_ONLY_PEERS else []), requirement)
        except CommandFailed:
            session.warn(f"{requirement} could not be installed here (no wheel for this platform, or its "
                         "build failed): its peer cases skip, naming it")


@nox.session(default=False)
def ab(session: nox.Session) -> None:
    """Same-job A/B: benchmarks of BASE and this tree in turns on one GPU (-- BASE [pytest args])."""
    _install_default_stack(session)
    session.run(_python(session), "-m", "harness.run.ab", *session.posargs, external=_installed(session))


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """Re-render reports/all-report.html, all-junit.xml and all-summary.md from recorded runs (posargs: run dirs)."""
    if not _installed(session):
        session.install(*REPORT_DEPS)
    _pipeline(session, "report", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, hadolint on docker/Dockerfile, zizmor and actionlint on the GitHub workflows."""
    session.install(*commands.LINT_TOOLS)
    failed = []
    checks = [
        ("ruff", ["ruff", "check", "."]),
        ("hadolint", ["hadolint", commands.DOCKERFILE]),
        ("zizmor", ["zizmor", "--offline", ".github/workflows"]),
    ]
    try:
        session.install(commands.ACTIONLINT, silent=True)
        checks.append(("actionlint", ["actionlint"]))
    except CommandFailed:
        session.warn(f"{commands.ACTIONLINT} could not be installed (its build downloads the actionlint "
                     "binary, which needs network access to GitHub): actionlint skipped, zizmor ran")
    for name, cmd in checks:
        try:
            session.run(*cmd)
        except CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"lint failed: {', '.join(failed)}")


@nox.session
def compile_matrix(session: nox.Session) -> None:
    """Every Triton kernel compiled for sm_80/90/100 under each triton of the tables; every .cu via nvcc."""
    versions = list(session.posargs) or list(compile_triton_versions())
    python = _python(session)
    failed = []
    if _installed(session):
        versions = ["installed"]
    else:
        torch = os.environ.get("KVH_TORCH", CPU_TORCH)
        _install_stack(session, torch, versions[0], extras=None)
    for i, version in enumerate(versions):
        if i > 0:
            session.install(f"triton=={version}")
        try:
            session.run(*commands.aot_command(python), env=commands.AOT_ENV, external=_installed(session))
        except CommandFailed:
            failed.append(f"kvbits.aot with triton {version}")

    if shutil.which("nvcc") is None:
        session.warn("nvcc not found: the compile check of kvbits/cuda/*.cu is skipped")
    else:
        try:
            session.run(python, "-m", "harness.compile.compile_cuda", external=_installed(session))
        except CommandFailed:
            failed.append("nvcc kvbits/cuda/*.cu")
    if failed:
        session.error(f"compile_matrix failed: {'; '.join(failed)}")


# Sessions that need a GPU in the container: buildah (chroot isolation) passes none.
GPU_ONLY_SESSIONS = ("gpu_verify", "sanitize")


def _container_cache() -> Path:
    """The host directory mounted at the container's /cache, made by this user so that the
    container's user can write it."""
    cache = Path(os.environ.get("KVH_CONTAINER_CACHE") or Path.home() / ".cache" / "kvbits" / "container")
    cache.mkdir(parents=True, exist_ok=True)
    return cache


@nox.session(python=False, default=False)
@nox.parametrize(("torch", "triton"), GPU_PARAMS)
def container(session: nox.Session, torch: str, triton: str) -> None:
    """Build docker/Dockerfile for a GPU leg, run a session in it (default gpu_verify) with --gpus all."""
    leg = gpu_leg(torch, triton)
    inner, *args = list(session.posargs) or ["gpu_verify"]
    engine = _container_engine()
    if engine is None:
        session.error("no container builder here: the GPU sessions need Docker with the NVIDIA container toolkit "
                      "(or podman with CDI: see the README); buildah builds the image and runs a CPU session in it")
    if engine == commands.BUILDAH and inner in GPU_ONLY_SESSIONS:
        session.error(f"{inner} needs the GPUs, which buildah's chroot isolation does not pass (no usable docker "
                      f"here): Docker with the NVIDIA container toolkit, or podman with CDI (README); a CPU "
                      f"session runs in this image: -- verify")
    (ROOT / commands.REPORTS_DIR).mkdir(exist_ok=True)
    if engine == commands.DOCKER:  # every GPU (--gpus all), as the calling user
        session.run(*commands.docker_build_command(leg, context=str(ROOT),
                                                   dockerfile=str(ROOT / commands.DOCKERFILE)), external=True)
        session.run(*commands.docker_run_command(leg, repo=str(ROOT), cache=str(_container_cache()), uid=os.getuid(),
                                                 gid=os.getgid(), session=inner, args=args, environ=os.environ),
                    external=True)
        return
    with _stopwatch(session, "image build"):
        session.run(*commands.build_command(engine, commands.gpu_image(leg), context=str(ROOT),
                                            dockerfile=str(ROOT / commands.DOCKERFILE)), external=True)
    with _stopwatch(session, f"{inner} in the container"):
        _run_in_image(session, engine, leg.image, commands.inner_nox_command(leg, inner, args))


def _docker_usable() -> bool:
    """docker is installed and its engine answers: a client without one builds nothing."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _container_engine() -> str | None:
    return commands.pick_engine(docker_usable=_docker_usable(), buildah_found=shutil.which("buildah") is not None)


@contextlib.contextmanager
def _stopwatch(session: nox.Session, what: str):
    """Logs the wall time of the block, whether it ends well or not."""
    start = time.monotonic()
    try:
        yield
    finally:
        session.log(f"{what}: {time.monotonic() - start:.0f} s wall")


def _succeeds(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (debootstrap mounts /proc, /sys and /dev in its target
    while it works): a tree with any must not be deleted."""
    prefix = str(root.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1] for line in lines if len(line.split()) > 1]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _remove_root_tree(session: nox.Session, root: Path) -> None:
    mounted = _mounts_under(root)
    if mounted:
        session.error(f"{root} still has mounts ({', '.join(mounted)}): unmount them, then remove it")
    shutil.rmtree(root, ignore_errors=True)


def _base_archive() -> Path:
    """Where debootstrap's root file system is kept between runs: under ``KVH_CACHE_DIR``, which
    survives an emptied image store."""
    cache = Path(os.environ.get("KVH_CACHE_DIR") or Path.home() / ".cache" / "kvbits")
    return cache / "base-images" / f"debian-{commands.DEBIAN_SUITE}-minbase.tar"


def _debootstrap_archive(session: nox.Session, archive: Path) -> None:
    """debootstrap a minimal Debian into a scratch tree next to ``archive``, then archive it (the
    archive appears whole or not at all)."""
    if shutil.which("debootstrap") is None:
        session.error("debootstrap is not installed (apt-get install debootstrap): it makes the Debian base")
    if os.geteuid() != 0:
        session.error("debootstrap needs root: run as root, or set KVH_CONTAINER_BASE to an image with Python")
    archive.parent.mkdir(parents=True, exist_ok=True)
    root = archive.with_suffix(".root")
    partial = archive.with_suffix(".partial")
    _remove_root_tree(session, root)  # left by a run cut short
    try:
        with _stopwatch(session, "debootstrap"):
            session.run(*commands.debootstrap_command(str(root)), external=True)
        session.run(*commands.rootfs_tar_command(str(root), str(partial)), external=True)
        partial.replace(archive)
    finally:
        _remove_root_tree(session, root)
        partial.unlink(missing_ok=True)


def _debootstrapped_base(session: nox.Session, engine: str) -> str:
    """The local Debian base image, made here with debootstrap the first time and imported from
    its cached archive when the engine's store lost it."""
    image = commands.LOCAL_BASE_IMAGE
    if _succeeds(commands.image_exists_command(engine, image)):
        session.log(f"base image {image}: already in the {engine} store")
        return image
    archive = _base_archive()
    if archive.exists():
        session.log(f"base image {image}: imported from {archive}")
    else:
        _debootstrap_archive(session, archive)
    with _stopwatch(session, "base image import"):
        for cmd in commands.import_commands(engine, str(archive), image, name=f"kvbits-base-{os.getpid()}"):
            session.run(*cmd, external=True, silent=True)
    return image


def _host_pip_settings(session: nox.Session, engine: str) -> pip_settings.BuildPipSettings:
    """This host's pip settings for the build; those a builder cannot take along are named."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=False).stdout
    settings = pip_settings.for_build(pip_settings.parse_config_list(listed), mount_local=engine == commands.BUILDAH)
    for item in settings.left_out:
        session.warn(f"host pip setting left out of the image build (not found, or {engine} build mounts no "
                     f"host path): {item}")
    return settings


def _build_image(session: nox.Session, engine: str, image: commands.Image) -> None:
    """Build ``image`` with the host's pip settings as build secrets, from a private scratch file
    removed afterwards."""
    settings = _host_pip_settings(session, engine)
    with tempfile.TemporaryDirectory(prefix="kvbits-pip-") as scratch:
        config = Path(scratch) / "pip.conf"
        config.touch(mode=0o600)
        config.write_text(settings.config)
        build = commands.build_command(engine, image, context=str(ROOT), dockerfile=str(ROOT / commands.DOCKERFILE),
                                       secrets=settings.secrets(str(config)), volumes=settings.mounts)
        with _stopwatch(session, "image build"):
            session.run(*build, external=True)


def _run_in_image(session: nox.Session, engine: str, image: str, inner: list[str]) -> None:
    """``inner`` in ``image`` with the checkout at /workspace, so that reports/ lands in it."""
    where = {"repo": str(ROOT), "cache": str(_container_cache()), "uid": os.getuid(), "gid": os.getgid(),
             "environ": os.environ}
    (ROOT / commands.REPORTS_DIR).mkdir(exist_ok=True)
    if engine == commands.DOCKER:
        session.run(*commands.docker_run_image_command(image, inner, gpus=False, **where), external=True)
        return
    name = f"kvbits-run-{os.getpid()}"
    session.run(*commands.buildah_from_command(image, name), external=True, silent=True)
    try:
        session.run(*commands.buildah_run_command(name, inner, **where), external=True)
    finally:
        session.run(*commands.buildah_rm_command(name), external=True, silent=True)


@nox.session(python=False, default=False)
def container_cpu(session: nox.Session) -> None:
    """docker/Dockerfile on a CPU base (KVH_CONTAINER_BASE), a CPU session inside (default verify)."""
    inner, *args = list(session.posargs) or ["verify"]
    engine = _container_engine()
    if engine is None:
        session.error("no container builder here: docker with an engine that answers `docker info`, or buildah "
                      "(apt-get install buildah; no daemon needed)")
    session.log(f"container engine: {engine}")
    base = os.environ.get("KVH_CONTAINER_BASE") or commands.CPU_BASE_IMAGE
    if base == commands.DEBOOTSTRAP_BASE:
        base = _debootstrapped_base(session, engine)
    image = commands.cpu_image(base, torch_index_url=os.environ.get("KVH_TORCH_INDEX_URL", ""))
    _build_image(session, engine, image)
    with _stopwatch(session, f"{inner} in the container"):
        _run_in_image(session, engine, image.tag, commands.inner_nox_command(None, inner, args))


def _run_then_report(session: nox.Session, module: str, name: str) -> None:
    """``python -m harness.<module>`` into reports/runs/<name>, then its report (rendered even when
    the run fails, so that the failures can be read)."""
    python = _python(session)
    run_dir = f"{commands.REPORTS_DIR}/{commands.RUNS_SUBDIR}/{name}"
    try:
        session.run(python, "-m", f"harness.{module}", "--results-dir", run_dir, *session.posargs,
                    external=_installed(session))
    finally:
        if Path(run_dir, "records.jsonl").exists():
            session.run(python, "-m", "harness", "report", run_dir, "-o", f"{commands.REPORTS_DIR}/{name}.html",
                        external=_installed(session))


@nox.session(default=False)
def mutants(session: nox.Session) -> None:
    """Planted kernel bugs, one at a time, against their suites (posargs: --ci, --only NAME, --jobs N)."""
    _install_default_stack(session)
    _run_then_report(session, "checks.mutants", "mutants")


@nox.session(default=False)
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer memcheck, racecheck and initcheck over every GPU kernel; refuses without a GPU."""
    if not _installed(session):
        _require_cuda_driver(session)
        leg = next(leg for leg in GPU_LEGS if leg.triton == "3.6.0")  # the reference H200 stack
        _install_stack(session, leg.torch, leg.triton, leg.torch_index_url)
    _run_then_report(session, "checks.sanitize", "sanitize")
