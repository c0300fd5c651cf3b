"""noxfile.py: the sessions nox lists, what each one installs and runs (a recording stand-in for
nox's Session, no virtualenv built), and gpu_verify refusing to run without a CUDA device."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

nox = pytest.importorskip("nox")
from nox.command import CommandFailed  # noqa: E402

from harness.run import commands, legs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
_ids = itertools.count()


def load_noxfile():
    """A fresh copy of noxfile.py (its once-per-invocation state starts empty)."""
    spec = importlib.util.spec_from_file_location(f"noxfile_copy_{next(_ids)}", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # nox warns when a session name is registered again
        warnings.simplefilter("ignore", FutureWarning)
        spec.loader.exec_module(module)
    return module


class Stop(Exception):
    """session.skip / session.error."""


@pytest.fixture(autouse=True)
def _keep_leg_venvs(monkeypatch):
    """CI runs these tests with KVH_DROP_LEG_VENVS=1 set for its own legs: not for these."""
    monkeypatch.delenv("KVH_DROP_LEG_VENVS", raising=False)


class FakeSession:
    def __init__(self, tmp_path, *, venv_backend="virtualenv", posargs=(), failing=(), output=""):
        self.name = "fake"
        self.venv_backend = venv_backend
        self.posargs = list(posargs)
        self.failing = failing
        self.output = output
        self.tmp = tmp_path
        self.virtualenv = SimpleNamespace(location=str(tmp_path / ".nox" / "tests-leg"))
        self.calls: list[tuple] = []
        self.warnings: list[str] = []

    def _maybe_fail(self, args):
        if any(f in args for f in self.failing):
            raise CommandFailed("planned failure")

    def install(self, *args, **kwargs):
        self.calls.append(("install", args))
        self._maybe_fail(args)

    def run(self, *args, env=None, external=False, silent=False, **kwargs):
        self.calls.append(("run", args, env))
        self._maybe_fail(args)
        return self.output if silent else True

    def log(self, *args):
        pass

    def warn(self, *args):
        self.warnings.append(" ".join(map(str, args)))

    def skip(self, *args):
        raise Stop("skip: " + " ".join(map(str, args)))

    def error(self, *args):
        raise Stop("error: " + " ".join(map(str, args)))

    def create_tmp(self):
        return str(self.tmp)

    def runs(self):
        return [c[1] for c in self.calls if c[0] == "run"]

    def installs(self):
        return [list(c[1]) for c in self.calls if c[0] == "install"]


# -- nox -l ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def listing() -> list[tuple[bool, str, str]]:
    """``nox -l`` as (selected by default, session id, description) rows."""
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = []
    for line in out.stdout.splitlines():
        if line[:2] in ("* ", "- ") and " -> " in line:
            session, description = line[2:].split(" -> ", 1)
            rows.append((line[0] == "*", session, description))
    return rows


def test_every_session_is_listed_with_a_one_line_description(listing):
    names = {session.split("(")[0] for _, session, _ in listing}
    assert names == {"tests", "verify", "gpu_verify", "bench", "peers", "ab", "report", "lint", "compile_matrix",
                     "container", "container_cpu", "mutants", "sanitize"}
    for _, session, description in listing:
        assert description.strip() and len(description) < 110, (session, description)


def test_parametrized_ids_are_the_declared_legs(listing):
    ids = {session for _, session, _ in listing}
    assert {leg.session for leg in legs.INTERPRETER_LEGS} <= ids
    assert {leg.session for leg in legs.GPU_LEGS} <= ids
    assert {leg.container_session for leg in legs.GPU_LEGS} <= ids
    assert len([s for s in ids if s.startswith("tests(")]) == len(legs.INTERPRETER_LEGS)


def test_plain_nox_runs_what_ci_runs(listing):
    selected = {session.split("(")[0] for chosen, session, _ in listing if chosen}
    assert selected == {"tests", "lint", "compile_matrix"}


# -- gpu_verify refuses without CUDA ----------------------------------------------------------------


def test_gpu_verify_module_refuses_without_cuda(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.gpu_verify", "--reports-dir", str(tmp_path / "r")],
                         cwd=ROOT, env=NO_GPU, capture_output=True, text=True, timeout=300)
    assert out.returncode == 3
    assert "gpu_verify needs a CUDA device" in out.stderr and "Nothing was run" in out.stderr
    assert not (tmp_path / "r").exists()


def test_nox_gpu_verify_no_venv_refuses_without_cuda():
    out = subprocess.run([sys.executable, "-m", "nox", "--no-venv", "-s", "gpu_verify"], cwd=ROOT, env=NO_GPU,
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "gpu_verify needs a CUDA device" in text
    skipped = [line for line in text.splitlines()
               if line.startswith("nox > Session gpu_verify(") and "skipped: --no-venv" in line]
    assert len(skipped) == len(legs.GPU_LEGS) - 1


# -- what the sessions install and run --------------------------------------------------------------


def test_tests_session_installs_the_leg_and_runs_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, posargs=["-k", "pack"])
    noxfile.tests(session, triton="3.4.0")
    assert session.installs() == commands.install_commands("2.13.0", "3.4.0")
    assert session.runs() == [("python", "-m", "harness.run.pipeline", "tests", "--leg",
                               "cpu-torch2.13.0-triton3.4.0", "-k", "pack")]


def test_torch_index_url_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVH_TORCH_INDEX_URL", "https://example.invalid/cpu")
    noxfile = load_noxfile()
    session = FakeSession(tmp_path)
    noxfile.tests(session, triton="3.9.0")
    assert session.installs()[0] == ["--index-url", "https://example.invalid/cpu", "torch==2.13.0"]


@pytest.mark.parametrize("failing", [(), ("harness.run.pipeline",)], ids=["passed", "failed"])
def test_a_leg_venv_is_dropped_when_asked_whether_the_leg_passed_or_not(tmp_path, monkeypatch, failing):
    monkeypatch.setenv("KVH_DROP_LEG_VENVS", "1")
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    session = FakeSession(tmp_path, failing=failing)
    venv = Path(session.virtualenv.location)
    (venv / "lib").mkdir(parents=True)
    other = tmp_path / ".nox" / "tests-other-leg"
    other.mkdir()
    if failing:
        with pytest.raises(CommandFailed):
            noxfile.tests(session, triton="3.4.0")
    else:
        noxfile.tests(session, triton="3.4.0")
    assert not venv.exists()
    assert other.is_dir()  # only the leg's own venv goes


@pytest.mark.parametrize("setting", [None, "0"])
def test_a_leg_venv_is_kept_by_default(tmp_path, monkeypatch, setting):
    if setting is not None:
        monkeypatch.setenv("KVH_DROP_LEG_VENVS", setting)
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    session = FakeSession(tmp_path)
    Path(session.virtualenv.location).mkdir(parents=True)
    noxfile.tests(session, triton="3.4.0")
    assert Path(session.virtualenv.location).is_dir()


def test_a_venv_outside_nox_dir_is_never_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("KVH_DROP_LEG_VENVS", "1")
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "ROOT", tmp_path / "project")
    session = FakeSession(tmp_path)
    Path(session.virtualenv.location).mkdir(parents=True)
    noxfile.tests(session, triton="3.4.0")
    assert Path(session.virtualenv.location).is_dir()
    assert any("left in place" in w for w in session.warnings)


def test_no_venv_runs_a_family_once_on_the_installed_stack(tmp_path):
    noxfile = load_noxfile()
    first = FakeSession(tmp_path, venv_backend="none")
    noxfile.tests(first, triton="3.4.0")
    assert first.installs() == []
    assert first.runs() == [(sys.executable, "-m", "harness.run.pipeline", "tests")]
    with pytest.raises(Stop, match="skip: --no-venv: tests already ran"):
        noxfile.tests(FakeSession(tmp_path, venv_backend="none"), triton="3.6.0")
    gpu = FakeSession(tmp_path, venv_backend="none", posargs=["--no-bench"])
    noxfile.gpu_verify(gpu, torch="2.11.0", triton="3.6.0")
    assert gpu.runs() == [(sys.executable, "-m", "harness.gpu_verify", "--no-bench")]
    with pytest.raises(Stop, match="skip"):
        noxfile.gpu_verify(FakeSession(tmp_path, venv_backend="none"), torch="2.14.1", triton="3.8.0")


def test_gpu_verify_installed_posarg_uses_the_interpreter_running_nox(tmp_path):
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, posargs=["--installed", "-k", "int8"])
    noxfile.gpu_verify(session, torch="2.11.0", triton="3.6.0")
    assert session.installs() == []
    assert session.runs() == [(sys.executable, "-m", "harness.gpu_verify", "-k", "int8")]


def test_gpu_verify_leg_installs_its_pins_from_its_index(tmp_path, monkeypatch):
    monkeypatch.setenv("KVH_TORCH_INDEX_URL", "https://example.invalid/cpu")  # for CPU sessions only
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "_require_cuda_driver", lambda session: None)
    leg = legs.GPU_LEGS[0]
    session = FakeSession(tmp_path)
    noxfile.gpu_verify(session, torch=leg.torch, triton=leg.triton)
    assert session.installs() == commands.install_commands(leg.torch, leg.triton, index_url=leg.torch_index_url)
    assert session.runs() == [("python", "-m", "harness.run.pipeline", "gpu_verify", "--leg", leg.name)]


def test_gpu_verify_leg_refuses_before_installing_without_a_gpu(tmp_path, monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: None)
    session = FakeSession(tmp_path)
    with pytest.raises(Stop, match="error: gpu_verify needs a CUDA device"):
        noxfile.gpu_verify(session, torch="2.11.0", triton="3.6.0")
    assert session.calls == []


def test_verify_and_bench_install_the_default_stack(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("KVH_TORCH", raising=False)
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    noxfile = load_noxfile()
    for name in ("verify", "bench"):
        session = FakeSession(tmp_path)
        getattr(noxfile, name)(session)
        assert session.installs() == commands.install_commands(legs.CPU_TORCH, "3.6.0")
        assert session.runs() == [("python", "-m", "harness.run.pipeline", name)]


def test_without_a_gpu_verify_installs_the_tests_leg_and_with_one_torchs_own_triton(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("KVH_TORCH", raising=False)
    monkeypatch.delenv("KVH_TRITON", raising=False)
    noxfile = load_noxfile()
    for gpu, triton in ((False, noxfile._default_triton()), (True, None)):
        monkeypatch.setattr(noxfile, "_has_gpu", lambda gpu=gpu: gpu)
        session = FakeSession(tmp_path)
        noxfile.verify(session)
        assert session.installs() == commands.install_commands(legs.CPU_TORCH, triton)


def _runner_session(noxfile, tmp_path, monkeypatch):
    """A FakeSession with a nox runner whose virtualenv is .nox/<own>; creating one is noted, not done."""
    created = []
    monkeypatch.setattr(noxfile.nox.virtualenv.VirtualEnv, "create", lambda venv: created.append(venv.location))
    session = FakeSession(tmp_path)
    own = noxfile.nox.virtualenv.VirtualEnv(str(tmp_path / ".nox" / "own"), reuse_existing=True)
    session._runner = SimpleNamespace(venv=own, global_config=SimpleNamespace(envdir=str(tmp_path / ".nox")))
    return session, created


@pytest.mark.parametrize("name", ["verify", "bench", "ab", "mutants"])
def test_a_session_installing_a_legs_packages_runs_in_that_legs_virtualenv(tmp_path, monkeypatch, name):
    """verify (bench, ab, mutants) on the pins of a tests leg: that leg's virtualenv, one for both."""
    monkeypatch.delenv("KVH_TORCH", raising=False)
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "_run_then_report", lambda session, module, run: None)
    session, created = _runner_session(noxfile, tmp_path, monkeypatch)
    getattr(noxfile, name)(session)
    leg_venv = nox.sessions._normalize_path(str(tmp_path / ".nox"), "tests(triton='3.6.0')")  # (hashed when long)
    assert created == [leg_venv] and session._runner.venv.location == leg_venv
    assert session._runner.venv.reuse_existing
    assert session.installs() == commands.install_commands(legs.CPU_TORCH, "3.6.0")


def test_a_session_on_other_pins_or_adding_packages_keeps_its_own_virtualenv(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH", raising=False)
    noxfile = load_noxfile()
    for triton, name in (("3.6.0", "peers"), ("3.5.0", "verify")):
        monkeypatch.setenv("KVH_TRITON", triton)
        session, created = _runner_session(noxfile, tmp_path, monkeypatch)
        getattr(noxfile, name)(session)
        assert created == [] and session._runner.venv.location == str(tmp_path / ".nox" / "own")
    monkeypatch.setenv("KVH_TORCH", "2.11.0")
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    session, created = _runner_session(noxfile, tmp_path, monkeypatch)
    noxfile.verify(session)
    assert created == []


def test_the_legs_virtualenv_is_the_one_nox_gives_the_tests_session():
    """The shared location is nox's own name for the leg session's virtualenv (``nox -l`` ids)."""
    assert nox.sessions._normalize_path(".nox", legs.interpreter_leg("3.9.0").session) == ".nox/tests-triton-3-9-0"


def test_peers_session_runs_the_bench_pipeline_on_the_peers_marker(tmp_path, monkeypatch):
    """The bench pipeline's pytest step selects ``-m bench``; the ``-m peers`` after it is the one
    pytest keeps, and the caller's arguments come after both."""
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("KVH_TORCH", raising=False)
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, posargs=["-k", "kvbits"])
    noxfile.peers(session)
    peers = nox.project.load_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]["peers"]
    assert session.installs() == [*commands.install_commands(legs.CPU_TORCH, "3.6.0"),
                                  *([*(["--only-binary=flash-attn"] if r.startswith("flash-attn") else []), r]
                                    for r in peers)]
    assert session.runs() == [("python", "-m", "harness.run.pipeline", "bench", "-m", "peers", "-k", "kvbits")]
    installed = FakeSession(tmp_path, venv_backend="none")
    noxfile.peers(installed)
    assert installed.installs() == []
    assert installed.runs() == [(sys.executable, "-m", "harness.run.pipeline", "bench", "-m", "peers")]
    step = commands.plan("bench", python="py", leg="L", gpus=[], extra=session.runs()[0][4:])[0]
    marks = [step.argv[i + 1] for i, arg in enumerate(step.argv) if arg == "-m"]
    assert marks[-1] == "peers" and step.argv[-2:] == ["-k", "kvbits"]


def test_a_peer_that_does_not_install_is_said_and_the_others_still_run(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    noxfile = load_noxfile()
    flash_attn = next(r for r in noxfile.EXTRAS["peers"] if r.startswith("flash-attn"))
    session = FakeSession(tmp_path, failing=(flash_attn,))
    noxfile.peers(session)
    assert any(flash_attn in w and "skip" in w for w in session.warnings), session.warnings
    assert len(session.warnings) == 1
    later = noxfile.EXTRAS["peers"][noxfile.EXTRAS["peers"].index(flash_attn) + 1:]
    assert later and all(any(r in args for args in session.installs()) for r in later)
    assert session.runs() == [("python", "-m", "harness.run.pipeline", "bench", "-m", "peers")]


def test_peers_marker_is_registered():
    markers = nox.project.load_toml(ROOT / "pyproject.toml")["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("peers:") and "nox -s peers" in m for m in markers)


def test_ab_session_installs_the_default_stack_and_passes_base_and_selection(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("KVH_TORCH", raising=False)
    monkeypatch.setenv("KVH_TRITON", "3.6.0")
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, posargs=["HEAD~1", "-k", "decode"])
    noxfile.ab(session)
    assert session.installs() == commands.install_commands(legs.CPU_TORCH, "3.6.0")
    assert session.runs() == [("python", "-m", "harness.run.ab", "HEAD~1", "-k", "decode")]
    installed = FakeSession(tmp_path, venv_backend="none", posargs=["HEAD~1"])
    noxfile.ab(installed)
    assert installed.installs() == []
    assert installed.runs() == [(sys.executable, "-m", "harness.run.ab", "HEAD~1")]


def test_the_container_runs_the_ab_session_inside(tmp_path, monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "_container_engine", lambda: "docker")
    monkeypatch.setenv("KVH_CONTAINER_CACHE", str(tmp_path / "cache"))
    leg = legs.GPU_LEGS[0]
    session = FakeSession(tmp_path, posargs=["ab", "HEAD~1"])
    noxfile.container(session, torch=leg.torch, triton=leg.triton)
    assert list(session.runs()[1][-6:]) == ["nox", "--no-venv", "-s", "ab", "--", "HEAD~1"]


def test_report_session_installs_only_the_report_and_history_extras(tmp_path):
    """The report's trend charts and per-GPU baselines read the run history."""
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, posargs=["reports/runs/tests-a"])
    noxfile.report(session)
    assert session.installs() == [["jinja2>=3.1", "matplotlib>=3.8", "sqlalchemy>=2.0", "psycopg[binary]>=3.1"]]
    assert session.runs() == [("python", "-m", "harness.run.pipeline", "report", "reports/runs/tests-a")]


def test_lint_runs_every_linter_and_names_the_failures(tmp_path):
    noxfile = load_noxfile()
    session = FakeSession(tmp_path, failing=(commands.ACTIONLINT, "ruff"))
    with pytest.raises(Stop, match="error: lint failed: ruff$"):
        noxfile.lint(session)
    assert session.installs()[0] == list(commands.LINT_TOOLS)
    assert session.runs() == [("ruff", "check", "."), ("hadolint", "docker/Dockerfile"),
                              ("zizmor", "--offline", ".github/workflows")]
    assert any("actionlint skipped" in w for w in session.warnings)
    ok = FakeSession(tmp_path)
    noxfile.lint(ok)
    assert ok.runs()[-1] == ("actionlint",)


def test_compile_matrix_swaps_triton_and_checks_cu_files(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("KVH_TORCH", raising=False)
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: "/usr/bin/nvcc" if name == "nvcc" else None)
    session = FakeSession(tmp_path, posargs=["3.4.0", "3.9.0"])
    noxfile.compile_matrix(session)
    assert session.installs() == [*commands.install_commands("2.13.0", "3.4.0", extras=None), ["triton==3.9.0"]]
    runs = session.runs()
    aot = tuple(commands.aot_command("python"))
    assert runs[:2] == [aot, aot]
    assert all(c[2] == commands.AOT_ENV for c in session.calls if c[0] == "run" and c[1] == aot)
    assert runs[2:] == [("python", "-m", "harness.compile.compile_cuda")]


def test_compile_matrix_without_nvcc_says_so_and_reports_aot_failures(tmp_path, monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: None)
    session = FakeSession(tmp_path, venv_backend="none", failing=("kvbits.aot",))
    with pytest.raises(Stop, match="error: compile_matrix failed: kvbits.aot with triton installed"):
        noxfile.compile_matrix(session)
    assert session.installs() == []
    assert any("nvcc not found" in w for w in session.warnings)


def test_container_builds_the_leg_and_runs_a_session_inside(tmp_path, monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "_container_engine", lambda: "docker")
    monkeypatch.setenv("KVH_CONTAINER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CI", "true")
    leg = legs.GPU_LEGS[1]
    session = FakeSession(tmp_path, posargs=["gpu_verify", "--no-bench"])
    noxfile.container(session, torch=leg.torch, triton=leg.triton)
    build, run = session.runs()
    assert list(build) == commands.docker_build_command(leg, context=str(ROOT),
                                                        dockerfile=str(ROOT / "docker" / "Dockerfile"))
    assert list(run) == commands.docker_run_command(leg, repo=str(ROOT), cache=str(tmp_path / "cache"),
                                                    uid=os.getuid(), gid=os.getgid(), session="gpu_verify",
                                                    args=["--no-bench"], environ=os.environ)
    assert list(run[-4:]) == ["-s", leg.session, "--", "--no-bench"] and "CI" in run
    assert (tmp_path / "cache").is_dir()
    plain = FakeSession(tmp_path)
    noxfile.container(plain, torch=leg.torch, triton=leg.triton)
    assert list(plain.runs()[1][-2:]) == ["-s", leg.session]


def test_container_without_docker_builds_the_leg_with_buildah_and_runs_only_cpu_sessions(tmp_path, monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "_container_engine", lambda: "buildah")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setenv("KVH_CONTAINER_CACHE", str(tmp_path / "cache"))
    leg = legs.GPU_LEGS[1]
    for refused in ([], ["gpu_verify"], ["sanitize"]):
        with pytest.raises(Stop, match="needs the GPUs, which buildah's chroot isolation does not pass"):
            noxfile.container(FakeSession(tmp_path, posargs=refused), torch=leg.torch, triton=leg.triton)
    session = FakeSession(tmp_path, posargs=["verify", "-x"])
    noxfile.container(session, torch=leg.torch, triton=leg.triton)
    build, start, run, remove = session.runs()
    assert list(build) == commands.build_command("buildah", commands.gpu_image(leg), context=str(tmp_path),
                                                 dockerfile=str(tmp_path / "docker" / "Dockerfile"))
    name = start[-2]
    assert list(start) == commands.buildah_from_command(leg.image, name)
    assert list(run[-8:]) == ["python", "-m", "nox", "--no-venv", "-s", "verify", "--", "-x"]
    assert list(remove) == commands.buildah_rm_command(name)
    monkeypatch.setattr(noxfile, "_container_engine", lambda: None)
    with pytest.raises(Stop, match="no container builder here"):
        noxfile.container(FakeSession(tmp_path), torch=leg.torch, triton=leg.triton)


# -- the CPU container ------------------------------------------------------------------------------


class ContainerSession(FakeSession):
    """A recording session for container_cpu: the tar step writes its archive, as tar would."""

    def run(self, *args, env=None, external=False, silent=False, **kwargs):
        if args[:1] == ("tar",):
            Path(args[args.index("-cf") + 1]).write_bytes(b"rootfs")
        return super().run(*args, env=env, external=external, silent=silent, **kwargs)


HOST_PIP = "global.cert='{ca}'\nglobal.find-links='{wheels}'\n"


@pytest.fixture
def cpu_container(tmp_path, monkeypatch):
    """noxfile with buildah as the engine, the host's pip settings HOST_PIP, caches under tmp_path."""
    noxfile = load_noxfile()
    ca = tmp_path / "ca.crt"
    ca.write_text("cert")
    (tmp_path / "wheels").mkdir()
    listed = HOST_PIP.format(ca=ca, wheels=tmp_path / "wheels")
    real_run = subprocess.run

    def fake_run(cmd, *args, **kwargs):
        if list(cmd[1:]) == ["-m", "pip", "config", "list"]:
            return subprocess.CompletedProcess(cmd, 0, stdout=listed, stderr="")
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(noxfile.subprocess, "run", fake_run)
    monkeypatch.setattr(noxfile, "_container_engine", lambda: "buildah")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setenv("KVH_CONTAINER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVH_CACHE_DIR", str(tmp_path / "kvcache"))
    monkeypatch.delenv("KVH_CONTAINER_BASE", raising=False)
    monkeypatch.delenv("KVH_TORCH_INDEX_URL", raising=False)
    monkeypatch.delenv("CI", raising=False)
    noxfile.CA = str(ca)
    return noxfile


def _written_pip_config(build: tuple) -> str:
    secret = next(arg for arg in build if arg.startswith("id=pip_config,src="))
    return secret.split("src=", 1)[1]


def test_container_cpu_builds_with_the_host_pip_settings_and_runs_verify_inside(tmp_path, cpu_container):
    session = ContainerSession(tmp_path)
    cpu_container.container_cpu(session)
    build, start, run, remove = session.runs()
    image = commands.cpu_image()
    config = _written_pip_config(build)
    assert list(build) == commands.build_command(
        "buildah", image, context=str(tmp_path), dockerfile=str(tmp_path / "docker" / "Dockerfile"),
        secrets={"pip_config": config, "ca_bundle": cpu_container.CA}, volumes=[str(tmp_path / "wheels")])
    assert not Path(config).exists()  # the rendered settings are gone once the image is built
    name = start[-2]
    assert list(start) == commands.buildah_from_command(image.tag, name)
    assert list(run) == commands.buildah_run_command(name, commands.inner_nox_command(None, "verify"),
                                                     repo=str(tmp_path), cache=str(tmp_path / "cache"),
                                                     uid=os.getuid(), gid=os.getgid(), environ=os.environ)
    assert list(remove) == commands.buildah_rm_command(name)
    assert (tmp_path / "reports").is_dir() and (tmp_path / "cache").is_dir()


def test_container_cpu_removes_its_working_container_when_the_session_inside_fails(tmp_path, cpu_container):
    session = ContainerSession(tmp_path, posargs=["tests", "-k", "pack"], failing=("run",))
    with pytest.raises(CommandFailed):
        cpu_container.container_cpu(session)
    *_, run, remove = session.runs()
    assert run[:2] == ("buildah", "run") and run[-7:] == ("nox", "--no-venv", "-s", "tests", "--", "-k", "pack")
    assert remove == tuple(commands.buildah_rm_command(run[-11]))


def test_container_cpu_debootstraps_the_base_once_and_keeps_its_archive(tmp_path, cpu_container, monkeypatch):
    monkeypatch.setenv("KVH_CONTAINER_BASE", "debootstrap")
    monkeypatch.setattr(cpu_container, "_succeeds", lambda cmd: False)  # not in the image store
    monkeypatch.setattr(cpu_container.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(cpu_container.os, "geteuid", lambda: 0)
    session = ContainerSession(tmp_path)
    cpu_container.container_cpu(session)
    archive = tmp_path / "kvcache" / "base-images" / "debian-bookworm-minbase.tar"
    root = archive.with_suffix(".root")
    runs = session.runs()
    assert runs[0] == tuple(commands.debootstrap_command(str(root)))
    assert runs[1] == tuple(commands.rootfs_tar_command(str(root), str(archive.with_suffix(".partial"))))
    name = runs[2][3]
    assert runs[2:5] == [tuple(c) for c in commands.import_commands("buildah", str(archive), commands.LOCAL_BASE_IMAGE,
                                                                     name=name)]
    assert f"BASE_IMAGE={commands.LOCAL_BASE_IMAGE}" in runs[5]
    assert archive.read_bytes() == b"rootfs" and not root.exists() and not archive.with_suffix(".partial").exists()
    again = ContainerSession(tmp_path)
    cpu_container.container_cpu(again)
    assert [cmd[0] for cmd in again.runs()[:3]] == ["buildah"] * 3  # imported from the archive, no debootstrap
    monkeypatch.setattr(cpu_container, "_succeeds", lambda cmd: True)  # in the store: nothing to import
    third = ContainerSession(tmp_path)
    cpu_container.container_cpu(third)
    assert third.runs()[0][:2] == ("buildah", "bud")


def test_container_cpu_says_what_is_missing(tmp_path, cpu_container, monkeypatch):
    monkeypatch.setattr(cpu_container, "_container_engine", lambda: None)
    with pytest.raises(Stop, match="no container builder here"):
        cpu_container.container_cpu(ContainerSession(tmp_path))
    monkeypatch.setattr(cpu_container, "_container_engine", lambda: "buildah")
    monkeypatch.setenv("KVH_CONTAINER_BASE", "debootstrap")
    monkeypatch.setattr(cpu_container, "_succeeds", lambda cmd: False)
    monkeypatch.setattr(cpu_container.shutil, "which", lambda name: None)
    with pytest.raises(Stop, match="debootstrap is not installed"):
        cpu_container.container_cpu(ContainerSession(tmp_path))


def test_docker_counts_only_with_an_engine_that_answers(monkeypatch):
    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: None)
    assert noxfile._docker_usable() is False
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: "/bin/false" if name == "docker" else None)
    assert noxfile._docker_usable() is False
    assert noxfile._container_engine() is None
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: "/bin/true")
    assert noxfile._container_engine() == "docker"
