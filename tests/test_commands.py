"""The command lines nox runs (harness/run/commands.py), the GPU worker pinning plugin
(harness/run/gpu_workers.py), the pipeline's pure parts, the Dockerfile and the workflows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import commands, gpu_workers, legs, pipeline
from harness.run.legs import GpuLeg, InterpreterLeg

ROOT = Path(__file__).resolve().parent.parent
LEG = GpuLeg("2.11.0", "3.6.0", "13.0.1", "cu130")
PY = "/venv/bin/python"


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


# -- leg tables ------------------------------------------------------------------------------------


def test_interpreter_legs_cover_three_triton_releases_with_one_torch():
    tritons = [leg.triton for leg in legs.INTERPRETER_LEGS]
    assert len(set(tritons)) >= 3
    assert {leg.torch for leg in legs.INTERPRETER_LEGS} == {legs.CPU_TORCH}
    assert min(tritons, key=_version) == "3.4.0"  # the oldest release pyproject admits
    assert len({leg.name for leg in legs.INTERPRETER_LEGS}) == len(tritons)


def test_gpu_legs_are_consistent():
    names = [leg.name for leg in legs.GPU_LEGS]
    assert len(set(names)) == len(names) >= 3
    tag = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    for leg in legs.GPU_LEGS:
        # load_inline refuses an nvcc whose CUDA major differs from torch's build
        assert leg.index == "cu" + "".join(leg.cuda.split(".")[:2]), leg
        repo, _, version = leg.image.partition(":")
        assert repo == legs.IMAGE_NAME and tag.match(version), leg.image
        assert leg.cuda_image == f"nvidia/cuda:{leg.cuda}-devel-ubuntu24.04"
        assert leg.torch_index_url == f"https://download.pytorch.org/whl/{leg.index}"
    assert ("2.11.0", "3.6.0") in {(leg.torch, leg.triton) for leg in legs.GPU_LEGS}


def test_session_ids_are_nox_parametrize_ids():
    assert InterpreterLeg("3.6.0").session == "tests(triton='3.6.0')"
    assert LEG.session == "gpu_verify(torch='2.11.0', triton='3.6.0')"
    assert LEG.container_session == "container(torch='2.11.0', triton='3.6.0')"


def test_compile_versions_are_the_union_of_both_tables_oldest_first():
    versions = legs.compile_triton_versions()
    expected = {leg.triton for leg in legs.INTERPRETER_LEGS} | {leg.triton for leg in legs.GPU_LEGS}
    assert set(versions) == expected
    assert list(versions) == sorted(versions, key=_version)


def test_leg_lookup():
    assert legs.interpreter_leg("3.4.0").name == "cpu-torch2.13.0-triton3.4.0"
    assert legs.gpu_leg("2.11.0", "3.6.0").name == "gpu-torch2.11.0-triton3.6.0"
    with pytest.raises(ValueError, match="no interpreter leg for triton '9.9.9'"):
        legs.interpreter_leg("9.9.9")
    with pytest.raises(ValueError, match="no GPU leg"):
        legs.gpu_leg("2.11.0", "3.4.0")
    # an installed build names its leg as the leg's pins do: its local build label dropped
    assert legs.stack_leg_name("2.11.0+cu130", "3.6.0", gpu=True) == legs.gpu_leg("2.11.0", "3.6.0").name
    assert legs.stack_leg_name("2.13.0+cpu", "3.9.0", gpu=False) == legs.interpreter_leg("3.9.0").name
    assert legs.interpreter_leg_for("2.13.0", "3.6.0") == legs.interpreter_leg("3.6.0")
    assert legs.interpreter_leg_for("2.13.0", None) is None
    assert legs.interpreter_leg_for("2.11.0", "3.6.0") is None


# -- install and pytest commands -------------------------------------------------------------------


def test_install_commands():
    model = commands.ACTIVATION_MODEL
    assert model[0] == "--no-deps"  # its declared sentence-transformers is not needed
    # the quality model's declared llm and llama-cpp-python (a source build) are not needed either
    models = [*model, commands.QUALITY_MODEL]
    assert commands.install_commands("2.13.0", "3.4.0") == [
        ["torch==2.13.0"],
        ["triton==3.4.0", "-e", ".[test,report,history,transformers,quality]", commands.TRANSFORMERS],
        models]
    assert commands.install_commands("2.11.0", "3.6.0", index_url="https://x/cu130") == [
        ["--index-url", "https://x/cu130", "torch==2.11.0"],
        ["triton==3.6.0", "-e", ".[test,report,history,transformers,quality]", commands.TRANSFORMERS], models]
    assert commands.install_commands("2.13.0", "3.4.0", extras="test") == [
        ["torch==2.13.0"], ["triton==3.4.0", "-e", ".[test]"], model]
    assert commands.install_commands("2.13.0", None, extras=None) == [["torch==2.13.0"], ["-e", "."]]


def test_pytest_command_pins_gpus_before_anything_else():
    cmd = commands.pytest_command(PY, ["suites"], marker="not bench", results_dir="r/x", leg="L",
                                  workers=2, pin_gpus=True, timeout=900, timeout_method="thread",
                                  extra=["-k", "pack"])
    assert cmd == [PY, "-m", "pytest", "-p", "harness.run.gpu_workers", "suites", "-m", "not bench",
                   "--results-dir", "r/x", "--leg", "L", "-n", "2", "--dist", "worksteal",
                   "--timeout=900", "--timeout-method=thread", "-k", "pack"]


def test_pytest_command_serial_without_timeout():
    cmd = commands.pytest_command(PY, ["suites"], marker="bench", results_dir="r", leg="L", workers=0)
    assert cmd == [PY, "-m", "pytest", "suites", "-m", "bench", "--results-dir", "r", "--leg", "L"]


def test_report_command():
    assert commands.report_command(PY, ["reports/runs/a", "reports/runs/b"], baseline="reports/baselines/h.json",
                                   family="gpu_verify") == [
        PY, "-m", "harness", "report", "reports/runs/a", "reports/runs/b",
        "-o", "reports/gpu_verify-report.html", "--junit", "reports/gpu_verify-junit.xml",
        "--summary-md", "reports/gpu_verify-summary.md", "--baseline", "reports/baselines/h.json"]
    assert commands.report_command(PY, ["d"], reports_dir="out")[-6:] == [
        "-o", "out/all-report.html", "--junit", "out/all-junit.xml", "--summary-md", "out/all-summary.md"]


def test_each_session_family_writes_its_own_report_files():
    """``nox -s tests`` after ``nox -s verify`` leaves verify's page, JUnit and summary as they were."""
    written = {kind: set(commands.report_paths(kind).values()) for kind in (*commands.KINDS, commands.ALL_FAMILIES)}
    for kind, paths in written.items():
        assert len(paths) == 3 and all(p.startswith(f"reports/{kind}-") for p in paths)
        for other, others in written.items():
            assert other == kind or not paths & others


# -- pipeline plans --------------------------------------------------------------------------------


def test_plan_tests_runs_unit_tests_and_suites_in_the_interpreter():
    (step,) = commands.plan("tests", python=PY, leg="cpu-L", gpus=[])
    assert step.name == "suites" and step.results_dir == "reports/runs/tests-cpu-L"
    assert step.argv == [PY, "-m", "pytest", "tests", "suites", "-m", "not bench",
                         "--results-dir", "reports/runs/tests-cpu-L", "--leg", "cpu-L",
                         "-n", "auto", "--dist", "worksteal", f"--timeout={commands.DEFAULT_TIMEOUT_S}"]
    assert step.env["TRITON_INTERPRET"] == "1" and step.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "harness.run.gpu_workers" not in step.argv


def test_plan_tests_ignores_gpus():
    (step,) = commands.plan("tests", python=PY, leg="L", gpus=["0", "1"])
    assert step.env == commands.INTERPRETER_ENV and "KVH_GPUS" not in step.env


def test_plan_gpu_verify_spreads_suites_over_gpus_then_benchmarks_serially():
    suites, bench = commands.plan("gpu_verify", python=PY, leg="gpu-L", gpus=["2", "3"], timeout=600)
    assert suites.argv == [PY, "-m", "pytest", "-p", "harness.run.gpu_workers", "suites", "-m", "not bench",
                           "--results-dir", "reports/runs/gpu_verify-gpu-L", "--leg", "gpu-L",
                           "-n", "2", "--dist", "worksteal", "--timeout=600", "--timeout-method=thread"]
    assert suites.env["KVH_GPUS"] == "2,3" and suites.env["TRITON_INTERPRET"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in suites.env
    assert bench.argv == [PY, "-m", "pytest", "suites", "-m", "bench and not sweep",
                          "--results-dir", "reports/runs/gpu_verify-gpu-L-bench", "--leg", "gpu-L",
                          "--timeout=600"]
    assert bench.ok == (0, 5) and suites.ok == (0,)
    assert "KVH_GPUS" not in bench.env and bench.env["TRITON_INTERPRET"] == "0"


def test_plan_gpu_verify_benchmarks_run_on_the_first_gpu_with_its_builds(tmp_path):
    """The benchmarks reuse the CUDA extensions that the suites' workers of that GPU built."""
    environ = {"KVH_EXT_DIR": str(tmp_path)}
    _, bench = commands.plan("gpu_verify", python=PY, leg="L", gpus=["3", "5"], environ=environ)
    assert bench.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert bench.env["KVH_EXT_DIR"] == str(tmp_path / "gpu-3")
    worker = {"PYTEST_XDIST_WORKER": "gw0", "KVH_GPUS": "3,5", **environ}
    assert gpu_workers.pin(worker) == "3"
    assert worker["KVH_EXT_DIR"] == bench.env["KVH_EXT_DIR"]
    assert worker["CUDA_VISIBLE_DEVICES"] == bench.env["CUDA_VISIBLE_DEVICES"]
    (alone,) = commands.plan("bench", python=PY, leg="L", gpus=["3"], environ=environ)
    assert "CUDA_VISIBLE_DEVICES" not in alone.env and "KVH_EXT_DIR" not in alone.env


def test_plan_gpu_suites_compile_each_triton_kernel_once_unless_a_cache_manager_is_chosen():
    suites, bench = commands.plan("gpu_verify", python=PY, leg="L", gpus=["0", "1"], environ={})
    assert suites.env["TRITON_CACHE_MANAGER"] == "harness.compile.triton_cache:CompileOnceCacheManager"
    assert "TRITON_CACHE_MANAGER" not in bench.env  # one process: nothing to share
    module, name = suites.env["TRITON_CACHE_MANAGER"].split(":")
    assert module == "harness.compile.triton_cache" and name == "CompileOnceCacheManager"
    (own,) = commands.plan("gpu_verify", python=PY, leg="L", gpus=["0"], bench=False,
                           environ={"TRITON_CACHE_MANAGER": "mine:Manager"})
    assert "TRITON_CACHE_MANAGER" not in own.env  # the user's choice is inherited untouched
    (interpreted,) = commands.plan("tests", python=PY, leg="L", gpus=[], environ={})
    assert "TRITON_CACHE_MANAGER" not in interpreted.env


@pytest.mark.parametrize(("environ", "expected"), [
    ({"KVH_GPUS": "0,1"}, True),
    ({"KVH_GPUS": "0", "PYTEST_XDIST_WORKER": "gw3"}, False),
    ({"KVH_GPUS": " "}, False),
    ({}, False),
])
def test_spread_controller_is_the_controller_of_a_run_over_gpus(environ, expected):
    assert commands.spread_controller(environ) is expected


@pytest.mark.parametrize(("gpus", "cpus", "expected"), [
    (1, 16, 8), (2, 32, 8), (1, 2, 1), (1, 1, 1), (4, 16, 2), (1, 64, 8), (2, None, 1),
])
def test_default_workers_per_gpu_shares_the_cores(gpus, cpus, expected):
    assert commands.default_workers_per_gpu(gpus, cpus) == expected


def test_default_workers_per_gpu_needs_a_gpu():
    with pytest.raises(ValueError, match="gpu_count"):
        commands.default_workers_per_gpu(0, 16)


def test_plan_one_gpu_still_uses_one_isolated_worker_and_workers_per_gpu_multiplies():
    (suites, _) = commands.plan("gpu_verify", python=PY, leg="L", gpus=["0"])
    assert suites.argv[suites.argv.index("-n") + 1] == "1"
    (suites, _) = commands.plan("gpu_verify", python=PY, leg="L", gpus=["0", "1"], workers_per_gpu=3)
    assert suites.argv[suites.argv.index("-n") + 1] == "6"


def test_plan_verify_falls_back_to_the_interpreter_without_gpus():
    (step,) = commands.plan("verify", python=PY, leg="L", gpus=[])
    assert step.argv[3] == "suites" and step.env == commands.INTERPRETER_ENV
    assert [s.name for s in commands.plan("verify", python=PY, leg="L", gpus=["0"])] == ["suites", "benchmarks"]
    assert [s.name for s in commands.plan("verify", python=PY, leg="L", gpus=["0"], bench=False)] == ["suites"]


def test_plan_bench_alone():
    (step,) = commands.plan("bench", python=PY, leg="L", gpus=[], timeout=None)
    assert step.argv == [PY, "-m", "pytest", "suites", "-m", "bench", "--results-dir", "reports/runs/bench-L",
                         "--leg", "L"]
    assert step.env == commands.INTERPRETER_ENV and step.ok == (0,)  # nothing collected: nothing checked
    (step,) = commands.plan("bench", python=PY, leg="L", gpus=["0"])
    assert step.env == commands.GPU_ENV


def test_plan_rejects_bad_requests():
    with pytest.raises(ValueError, match="gpu_verify needs at least one GPU"):
        commands.plan("gpu_verify", python=PY, leg="L", gpus=[])
    with pytest.raises(ValueError, match="kind must be one of"):
        commands.plan("nightly", python=PY, leg="L", gpus=[])
    with pytest.raises(ValueError, match="workers_per_gpu must be >= 1"):
        commands.plan("gpu_verify", python=PY, leg="L", gpus=["0"], workers_per_gpu=0)


# -- compile checks --------------------------------------------------------------------------------


def test_aot_and_nvcc_commands():
    assert commands.aot_command(PY) == [PY, "-m", "kvbits.aot", "--arch", "80", "90", "100",
                                        "--also", "harness.measure.read_floor"]
    assert commands.AOT_ENV == {"TRITON_INTERPRET": "0"}
    assert commands.nvcc_command("kvbits/cuda/x.cu", "/tmp/x.o", ["/t/include", "/py"]) == [
        "nvcc", "-arch=sm_90", "-std=c++20", "-O3", "--use_fast_math", "-lineinfo",
        "-include", "torch/types.h", "-include", "cuda.h", "-include", "cuda_runtime.h",
        "-I/t/include", "-I/py", "-c", "kvbits/cuda/x.cu", "-o", "/tmp/x.o"]


def test_header_shims_only_where_torch_lacks_them(tmp_path):
    rel = "c10/cuda/impl/cuda_cmake_macros.h"
    assert commands.missing_header_shims([str(tmp_path)]) == {rel: commands.CUDA_HEADER_SHIMS[rel]}
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text("#pragma once\n")
    assert commands.missing_header_shims(["/nonexistent", str(tmp_path)]) == {}


# -- container images ------------------------------------------------------------------------------

CPU_IMAGE = commands.cpu_image("localhost/kvbits-base:bookworm-minbase")


def test_docker_build_command():
    assert commands.docker_build_command(LEG, context="/src", dockerfile="/src/docker/Dockerfile") == [
        "docker", "build", "--file", "/src/docker/Dockerfile",
        "--build-arg", "BASE_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04",
        "--build-arg", "TORCH=2.11.0", "--build-arg", "TRITON=3.6.0",
        "--build-arg", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130",
        "--tag", "kvbits-gpu:torch2.11.0-triton3.6.0-cuda13.0.1", "/src"]


def test_the_cpu_image_is_the_cpu_torch_with_the_newest_interpreter_leg():
    newest = max((leg.triton for leg in legs.INTERPRETER_LEGS), key=_version)
    assert commands.cpu_image() == commands.Image(f"kvbits-cpu:torch{legs.CPU_TORCH}-triton{newest}",
                                                  commands.CPU_BASE_IMAGE, legs.CPU_TORCH, newest, "")
    mine = commands.cpu_image("python:3.10-slim", triton="3.4.0", torch_index_url="https://example.invalid/cpu")
    assert (mine.tag, mine.base, mine.torch_index_url) == (
        f"kvbits-cpu:torch{legs.CPU_TORCH}-triton3.4.0", "python:3.10-slim", "https://example.invalid/cpu")


def test_buildah_builds_in_a_chroot_with_layers_secrets_and_the_local_wheel_directories():
    secrets = {"pip_config": "/tmp/x/pip.conf", "ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}
    cmd = commands.build_command("buildah", CPU_IMAGE, context="/src", dockerfile="/src/docker/Dockerfile",
                                 secrets=secrets, volumes=["/opt/wheels", "/etc/xdg/pip/constraints.txt"])
    assert cmd == [
        "buildah", "bud", "--isolation", "chroot", "--layers", "--force-rm", "--format", "docker",
        "--file", "/src/docker/Dockerfile",
        "--build-arg", "BASE_IMAGE=localhost/kvbits-base:bookworm-minbase",
        "--build-arg", f"TORCH={legs.CPU_TORCH}", "--build-arg", f"TRITON={CPU_IMAGE.triton}",
        "--build-arg", "TORCH_INDEX_URL=",
        "--secret", "id=pip_config,src=/tmp/x/pip.conf",
        "--secret", "id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt",
        "--volume", "/opt/wheels:/opt/wheels:ro",
        "--volume", "/etc/xdg/pip/constraints.txt:/etc/xdg/pip/constraints.txt:ro",
        "--tag", CPU_IMAGE.tag, "/src"]


def test_docker_builds_with_secrets_and_mounts_no_host_directory():
    cmd = commands.build_command("docker", CPU_IMAGE, secrets={"pip_config": "/p"})
    assert cmd[:2] == ["docker", "build"] and cmd[-5:-3] == ["--secret", "id=pip_config,src=/p"]
    with pytest.raises(ValueError, match="docker build mounts no host directories"):
        commands.build_command("docker", CPU_IMAGE, volumes=["/opt/wheels"])
    with pytest.raises(ValueError, match="engine must be one of"):
        commands.build_command("podman", CPU_IMAGE)


@pytest.mark.parametrize(("docker_usable", "buildah_found", "engine"),
                         [(True, True, "docker"), (True, False, "docker"), (False, True, "buildah"),
                          (False, False, None)])
def test_docker_where_its_engine_answers_else_buildah(docker_usable, buildah_found, engine):
    assert commands.pick_engine(docker_usable=docker_usable, buildah_found=buildah_found) == engine


def test_docker_run_command_runs_the_legs_gpu_verify_as_the_calling_user():
    cmd = commands.docker_run_command(LEG, repo="/src", cache="/home/u/.cache/kv", uid=1001, gid=121,
                                      environ={"CI": "true", "GITHUB_SHA": "abc", "HOME": "/home/u", "GITHUB_REF": ""})
    assert cmd == [
        "docker", "run", "--rm", "--init", "--gpus", "all", "--user", "1001:121",
        "--volume", "/src:/workspace", "--volume", "/home/u/.cache/kv:/cache", "--workdir", "/workspace",
        "--env", "CI", "--env", "GITHUB_SHA",
        "kvbits-gpu:torch2.11.0-triton3.6.0-cuda13.0.1",
        "python", "-m", "nox", "--no-venv", "-s", "gpu_verify(torch='2.11.0', triton='3.6.0')"]


def test_docker_run_command_other_session_with_arguments():
    cmd = commands.docker_run_command(LEG, repo="/src", cache="/c", uid=0, gid=0, session="bench",
                                      args=["-k", "int8"])
    assert cmd[cmd.index(LEG.image) + 1:] == ["python", "-m", "nox", "--no-venv", "-s", "bench", "--", "-k", "int8"]
    assert "--env" not in cmd


def test_a_cpu_image_runs_without_gpus():
    inner = commands.inner_nox_command(None, "verify", ["-x"])
    assert inner == ["python", "-m", "nox", "--no-venv", "-s", "verify", "--", "-x"]
    assert commands.inner_nox_command(None, "gpu_verify") == ["python", "-m", "nox", "--no-venv", "-s", "gpu_verify"]
    cmd = commands.docker_run_image_command(CPU_IMAGE.tag, inner, repo="/src", cache="/c", uid=0, gid=0, gpus=False)
    assert cmd == ["docker", "run", "--rm", "--init", "--user", "0:0", "--volume", "/src:/workspace",
                   "--volume", "/c:/cache", "--workdir", "/workspace", CPU_IMAGE.tag, *inner]


def test_buildah_runs_in_a_working_container_of_the_image_mounted_as_docker_does():
    assert commands.buildah_from_command(CPU_IMAGE.tag, "kvbits-run-7") == [
        "buildah", "from", "--pull=never", "--name", "kvbits-run-7", CPU_IMAGE.tag]
    inner = commands.inner_nox_command(None, "verify")
    cmd = commands.buildah_run_command("kvbits-run-7", inner, repo="/src", cache="/c", uid=1001, gid=121,
                                       environ={"CI": "true", "GITHUB_SHA": "", "HOME": "/root"})
    assert cmd == ["buildah", "run", "--isolation", "chroot", "--user", "1001:121",
                   "--volume", "/src:/workspace", "--volume", "/c:/cache", "--workingdir", "/workspace",
                   "--env", "CI=true", "kvbits-run-7", "--", *inner]
    assert commands.buildah_rm_command("kvbits-run-7") == ["buildah", "rm", "kvbits-run-7"]


def test_the_debian_base_is_debootstrapped_archived_and_imported():
    assert commands.debootstrap_command("/c/root") == ["debootstrap", "--variant=minbase", "bookworm", "/c/root"]
    assert commands.rootfs_tar_command("/c/root", "/c/base.tar") == [
        "tar", "-C", "/c/root", "--exclude=./var/cache/apt/archives/*.deb", "-cf", "/c/base.tar", "."]
    image = commands.LOCAL_BASE_IMAGE
    assert image == "localhost/kvbits-base:bookworm-minbase"
    assert commands.import_commands("docker", "/c/base.tar", image, name="b") == [
        ["docker", "import", "/c/base.tar", image]]
    assert commands.import_commands("buildah", "/c/base.tar", image, name="b") == [
        ["buildah", "from", "--name", "b", "scratch"], ["buildah", "add", "b", "/c/base.tar", "/"],
        ["buildah", "commit", "--rm", "b", image]]
    assert commands.image_exists_command("docker", image) == ["docker", "image", "inspect", image]
    assert commands.image_exists_command("buildah", image) == ["buildah", "inspect", "--type", "image", image]


def _dockerfile_runs(text: str) -> list[str]:
    """Each RUN instruction of a Dockerfile, its continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_dockerfile_takes_the_build_args_and_runs_unprivileged():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    args = set(re.findall(r"^ARG (\w+)", text, flags=re.M))
    passed = {a.split("=", 1)[0] for a in commands.docker_build_command(LEG)[5:-3:2]}
    assert passed == {"BASE_IMAGE", "TORCH", "TRITON", "TORCH_INDEX_URL"}
    assert passed <= args
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.M)
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    for var in ("TRITON_CACHE_DIR", "KVH_EXT_DIR"):
        assert f"{var}={commands.CONTAINER_CACHE}/" in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*"):] == ["*", "!pyproject.toml"]


def test_every_pip_step_of_the_dockerfile_reads_the_host_settings_from_secrets_only():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    pip_steps = [run for run in _dockerfile_runs(text) if "pip install" in run]
    assert len(pip_steps) == 2
    for run in pip_steps:
        for secret_id, target in commands.SECRET_TARGETS.items():
            assert f"--mount=type=secret,id={secret_id},target={target}" in run, (secret_id, run)
        assert f"export PIP_CONFIG_FILE={commands.SECRET_TARGETS['pip_config']}" in run
    for secret_file in commands.SECRET_TARGETS.values():  # mounted, never copied into a layer
        assert not re.search(rf"^(COPY|ADD|ENV).*{re.escape(secret_file)}", text, flags=re.M)


# -- GitHub workflows ------------------------------------------------------------------------------


def _workflow(name: str) -> str:
    return (ROOT / ".github" / "workflows" / name).read_text()


def test_gpu_workflow_never_runs_pull_requests_on_the_gpu_runner():
    text = _workflow("gpu-verify.yml")
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    assert "pull_request" not in code
    assert "runs-on: [self-hosted, linux, gpu]" in text
    for trigger in ("push:", "workflow_dispatch:", "schedule:"):
        assert f"\n  {trigger}" in text
    assert "github.event.repository.fork != true" in text
    assert "python -m harness.run.commands matrix gpu" in text
    assert 'nox -s "$SESSION" -- gpu_verify' in text and "matrix.leg.container_session" in text
    assert '>> "$GITHUB_STEP_SUMMARY"' in text


def test_workflow_uploads_are_unique_and_unconditional():
    for name in ("gpu-verify.yml", "ci.yml"):
        text = _workflow(name)
        steps = text.split("\n      - ")
        uploads = [s for s in steps if "actions/upload-artifact@" in s]
        assert uploads, name
        for step in uploads:
            assert "if: always()" in step, step
            assert "${{ matrix.leg.name }}-${{ github.run_id }}-${{ github.run_attempt }}" in step, step
        for use in re.findall(r"uses: (\S+)", text):
            assert re.match(r"^[\w-]+/[\w-]+@[0-9a-f]{40}$", use), f"{name}: {use} is not pinned to a commit"


def test_ci_workflow_runs_every_interpreter_leg_lint_and_compile_matrix():
    text = _workflow("ci.yml")
    assert "python -m harness.run.commands matrix interpreter" in text
    assert 'nox -s "$SESSION"' in text and "matrix.leg.session" in text
    assert "nox -s lint" in text and "nox -s compile_matrix" in text
    assert "runs-on: ubuntu-latest" in text and "self-hosted" not in text


def test_matrix_rows_and_cli(capsys):
    gpu = commands.matrix("gpu")
    assert [r["name"] for r in gpu] == [leg.name for leg in legs.GPU_LEGS]
    assert gpu[1]["container_session"] == legs.GPU_LEGS[1].container_session
    assert commands.matrix("interpreter", "cpu-torch2.13.0-triton3.6.0") == [
        {"name": "cpu-torch2.13.0-triton3.6.0", "torch": "2.13.0", "triton": "3.6.0",
         "session": "tests(triton='3.6.0')"}]
    with pytest.raises(ValueError, match="no gpu leg named 'nope'"):
        commands.matrix("gpu", "nope")
    assert commands.main(["matrix", "gpu", "--only", ""]) == 0
    assert json.loads(capsys.readouterr().out) == gpu
    with pytest.raises(SystemExit):
        commands.main(["matrix", "gpu", "--only", "nope"])


# -- GPU worker pinning ----------------------------------------------------------------------------


def test_device_for_worker():
    assert gpu_workers.parse_devices(" 0, 2,,GPU-ab ") == ["0", "2", "GPU-ab"]
    assert gpu_workers.parse_devices(None) == []
    assert [gpu_workers.device_for_worker(f"gw{i}", ["4", "6"]) for i in range(5)] == ["4", "6", "4", "6", "4"]
    assert gpu_workers.device_for_worker("gw1", ["GPU-a", "GPU-b"]) == "GPU-b"
    with pytest.raises(ValueError, match="worker_id must look like 'gw<N>'"):
        gpu_workers.device_for_worker("master", ["0"])
    with pytest.raises(ValueError, match="at least one GPU"):
        gpu_workers.device_for_worker("gw0", [])


def test_pin_changes_only_workers(tmp_path):
    controller = {"KVH_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpu_workers.pin(controller) is None
    assert controller == {"KVH_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    no_list = {"PYTEST_XDIST_WORKER": "gw0"}
    assert gpu_workers.pin(no_list) is None and "CUDA_VISIBLE_DEVICES" not in no_list

    worker = {"PYTEST_XDIST_WORKER": "gw3", "KVH_GPUS": "0,1", "KVH_EXT_DIR": str(tmp_path)}
    assert gpu_workers.pin(worker) == "1"
    assert worker["CUDA_VISIBLE_DEVICES"] == "1"
    assert worker["KVH_EXT_DIR"] == str(tmp_path / "gpu-1")
    assert gpu_workers.pin(worker) == "1" and worker["KVH_EXT_DIR"] == str(tmp_path / "gpu-1")

    default_root = {"PYTEST_XDIST_WORKER": "gw0", "KVH_GPUS": "GPU-x"}
    gpu_workers.pin(default_root)
    assert default_root["KVH_EXT_DIR"] == str(commands.DEFAULT_EXT_ROOT / "gpu-GPU-x")


_INNER_CONFTEST = '''
import os, torch
SEEN_AT_IMPORT = os.environ.get("CUDA_VISIBLE_DEVICES")
torch.cuda.is_available()  # what the root conftest does: CUDA reads the variable here
'''
_INNER_TEST = '''
import json, os, pathlib, pytest
import conftest

@pytest.mark.parametrize("i", range(6))
def test_where(i, record):
    record.add(i=i)
    out = pathlib.Path(os.environ["OUT_DIR"]) / f"{os.environ['PYTEST_XDIST_WORKER']}.json"
    out.write_text(json.dumps({"at_import": conftest.SEEN_AT_IMPORT,
                               "now": os.environ.get("CUDA_VISIBLE_DEVICES"),
                               "ext": os.environ.get("KVH_EXT_DIR")}))

def test_without_record():
    pass
'''


def test_xdist_workers_are_pinned_before_conftest_and_records_name_their_gpu(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(_INNER_CONFTEST)
    (suite / "test_inner.py").write_text(_INNER_TEST)
    (suite / "pytest.ini").write_text("[pytest]\n")
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVH_GPUS": "5,7", "OUT_DIR": str(out),
           "KVH_EXT_DIR": str(tmp_path / "ext"), "CUDA_VISIBLE_DEVICES": "5,7"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop(gpu_workers.PINNED_VAR, None)
    cmd = commands.pytest_command(sys.executable, ["."], marker="not bench", results_dir=str(results),
                                  leg="pin-check", workers=2, pin_gpus=True)
    cmd[3:3] = ["-p", "harness.plugin", "-p", "no:cacheprovider"]
    run = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("gw*.json")}
    assert set(seen) == {"gw0", "gw1"}, run.stdout[-2000:]
    for worker, device in (("gw0", "5"), ("gw1", "7")):
        assert seen[worker] == {"at_import": device, "now": device, "ext": str(tmp_path / "ext" / f"gpu-{device}")}
    records = [json.loads(line) for line in (results / "records.jsonl").read_text().splitlines()]
    assert len(records) == 7
    for rec in records:
        assert rec["metrics"]["gpu"] == {"gw0": "5", "gw1": "7"}[rec["worker"]], rec
    assert {rec["metrics"].get("i") for rec in records} == {0, 1, 2, 3, 4, 5, None}


# -- pipeline helpers ------------------------------------------------------------------------------


def test_visible_devices():
    assert pipeline.visible_devices(2, {}) == ["0", "1"]
    assert pipeline.visible_devices(2, {"CUDA_VISIBLE_DEVICES": "3,1"}) == ["3", "1"]
    assert pipeline.visible_devices(1, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == ["GPU-a"]
    assert pipeline.visible_devices(0, {"CUDA_VISIBLE_DEVICES": ""}) == []


BASELINE_TEXT = json.dumps({"format": "kvh-baseline", "version": 1, "cases": {}})


def test_pick_baseline(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_BASELINE", raising=False)
    folder = tmp_path / "reports" / "baselines"
    folder.mkdir(parents=True)
    assert pipeline.pick_baseline(None, "L", gpu=True, root=tmp_path) is None
    (folder / "h200.json").write_text(BASELINE_TEXT)
    assert pipeline.pick_baseline(None, "L", gpu=True, root=tmp_path) == str(folder / "h200.json")
    assert pipeline.pick_baseline(None, "L", gpu=False, root=tmp_path) is None
    (folder / "L.json").write_text(BASELINE_TEXT)
    assert pipeline.pick_baseline(None, "L", gpu=True, root=tmp_path) == str(folder / "L.json")
    (folder / "L.json").unlink()
    (folder / "other.json").write_text(BASELINE_TEXT)
    assert pipeline.pick_baseline(None, "L", gpu=True, root=tmp_path) is None  # ambiguous: none
    (folder / "other.json").unlink()
    (folder / pipeline.STATIC_BASELINE).write_text(BASELINE_TEXT)  # machine-code figures: never a GPU baseline
    assert pipeline.pick_baseline(None, "L", gpu=True, root=tmp_path) == str(folder / "h200.json")
    assert pipeline.pick_baseline(None, "L", gpu=False, root=tmp_path) == str(folder / pipeline.STATIC_BASELINE)
    assert pipeline.pick_baseline("x.json", "L", gpu=False, root=tmp_path) == "x.json"
    monkeypatch.setenv("KVH_BASELINE", "env.json")
    assert pipeline.pick_baseline(None, "L", gpu=False, root=tmp_path) == "env.json"


def test_baseline_format_is_the_reports():
    from harness.report import baseline

    assert pipeline.BASELINE_FORMAT == baseline.FORMAT


@pytest.mark.parametrize(("leg", "file"), [
    ("gpu-torch2.11.0-triton3.6.0", "gpu-torch2.11.0+cu130-triton3.6.0"),  # a leg's pins, an installed build
    ("gpu-torch2.8.0+cu128-triton3.4.0", "gpu-torch2.8.0-triton3.4.0"),
])
def test_pick_baseline_matches_a_leg_with_or_without_the_local_torch_label(tmp_path, monkeypatch, leg, file):
    monkeypatch.delenv("KVH_BASELINE", raising=False)
    folder = tmp_path / "reports" / "baselines"
    folder.mkdir(parents=True)
    for name in (file, "gpu-torch2.14.1+cu130-triton3.8.0"):
        (folder / f"{name}.json").write_text(BASELINE_TEXT)
    assert pipeline.pick_baseline(None, leg, gpu=True, root=tmp_path) == str(folder / f"{file}.json")


def test_pick_baseline_counts_only_baseline_files_as_the_only_one(tmp_path, monkeypatch):
    monkeypatch.delenv("KVH_BASELINE", raising=False)
    folder = tmp_path / "reports" / "baselines"
    folder.mkdir(parents=True)
    (folder / "h200.json").write_text(BASELINE_TEXT)
    (folder / "packing-h200.json").write_text(json.dumps({"date": "2026-11-30", "copy_gbps": 4270.9}))
    (folder / "broken.json").write_text("{")
    assert pipeline.pick_baseline(None, "gpu-torch2.8.0-triton3.4.0", gpu=True, root=tmp_path) == str(
        folder / "h200.json")


def test_leg_run_dirs_hold_every_step_of_every_plan():
    for kind in commands.KINDS:
        gpus = [] if kind == "tests" else ["0"]
        dirs = commands.leg_run_dirs(kind, "L", reports_dir="R")
        assert all(step.results_dir in dirs for step in commands.plan(kind, python=PY, leg="L", gpus=gpus,
                                                                     reports_dir="R"))
    # and nothing else: "bench-L-bench" would be the bench session's directory of a leg "L-bench"
    assert commands.leg_run_dirs("bench", "L", reports_dir="R") == ["R/runs/bench-L"]
    assert commands.leg_run_dirs("tests", "L", reports_dir="R") == ["R/runs/tests-L"]


@pytest.mark.parametrize("leg", ["gpu-torch2.11.0+cu130-triton3.6.0", "cpu-torch2.13.0+cpu-triton3.9.0", "L"])
def test_leg_names_as_the_legs_spell_them_are_taken(leg):
    assert legs.leg_name(leg) == leg


@pytest.mark.parametrize("leg", ["", ".", "..", "x/../..", "a b", "-rf", "../up"])
def test_a_leg_name_that_is_no_plain_name_is_refused(leg, capsys):
    with pytest.raises(ValueError, match="a leg name is"):
        legs.leg_name(leg)
    with pytest.raises(SystemExit):
        pipeline.main(["tests", "--leg", leg])
    assert "--leg" in capsys.readouterr().err


def test_family_run_dirs(tmp_path):
    runs = tmp_path / "runs"
    for name in ("tests-cpu-a", "tests-cpu-b", "gpu_verify-gpu-a", "gpu_verify-gpu-a-bench"):
        (runs / name).mkdir(parents=True)
    (runs / "tests-stray.txt").write_text("")
    (runs / "20261129T220226Z").mkdir()  # a plain pytest run: not part of any pipeline's report
    assert pipeline.family_run_dirs("tests", str(tmp_path)) == [str(runs / "tests-cpu-a"), str(runs / "tests-cpu-b")]
    assert len(pipeline.family_run_dirs("gpu_verify", str(tmp_path))) == 2
    assert pipeline.family_run_dirs("bench", str(tmp_path / "none")) == []
    assert len(pipeline.all_run_dirs(str(tmp_path))) == 4


def test_pipeline_passes_unknown_arguments_to_pytest_in_order():
    args, extra = pipeline.build_parser().parse_known_args(
        ["gpu_verify", "-k", "pack and not slow", "--workers-per-gpu", "2", "-x", "--no-bench"])
    assert (args.kind, args.workers_per_gpu, args.no_bench) == ("gpu_verify", 2, True)
    assert extra == ["-k", "pack and not slow", "-x"]


def test_pipeline_end_to_end_writes_steps_and_a_report_that_shows_them(tmp_path):
    """The tests pipeline on one selected case: its records, the report with the pipeline's steps
    and wall time, and the steps file, with exit code 0."""
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.run.pipeline", "tests", "--reports-dir", str(reports),
         "-k", "test_extension_name_follows_the_source_and_flags", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    steps = json.loads((reports / "tests-steps.json").read_text())
    assert [s["step"] for s in steps["steps"]] == ["suites", "report"] and not steps["failed"]
    assert steps["wall_s"] > 0
    assert sorted(p.name for p in reports.iterdir() if p.is_file()) == [
        "tests-junit.xml", "tests-report.html", "tests-steps.json", "tests-summary.md"]
    html = (reports / "tests-report.html").read_text(encoding="utf-8")
    assert "pipeline <b>tests</b>" in html and "suites " in html and "1</b>passed" in html
