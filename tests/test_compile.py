"""Every kernel builds for the GPU, checked with no GPU on every interpreter leg.

The Triton interpreter accepts kernels that the compiler rejects, so each leg (each
triton release) also compiles every Triton kernel ahead of time for sm_90, and compiles
every CUDA source with nvcc where nvcc exists (a source whose identical inputs compiled
before, on an earlier leg, is recalled from harness.compile.compile_cuda's cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import commands

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_every_triton_kernel_compiles_for_sm90(record):
    result = _run(*commands.aot_command(sys.executable, ("90",))[1:])  # CI's command, for sm_90 alone
    lines = result.stdout.splitlines()
    compiled = sum(" ok " in line for line in lines)
    failed = [line for line in lines if "FAIL" in line]
    record.backend, record.variant = "triton", "aot-sm_90"
    record.add(states_checked=compiled, kernels_failed=len(failed))
    assert result.returncode == 0, "\n".join(failed) or result.stderr[-3000:]
    assert compiled >= 60, f"only {compiled} specializations compiled:\n{result.stdout[-2000:]}"


def test_the_read_floor_kernel_is_among_the_kernels_compiled_ahead_of_time():
    """CI's command names the harness's kernel modules after --also (kvbits names only its own);
    kvbits.aot compiles them alone here."""
    argv = commands.aot_command(sys.executable, ("90",))
    harness_modules = argv[argv.index("--also") + 1:]
    assert harness_modules == ["harness.measure.read_floor"]
    result = _run("-m", "kvbits.aot", "--arch", "90", "--module", *harness_modules)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if "read_floor_chunks" in line]
    assert " ok " in line and int(line.split(" ok ")[1].split()[0]) > 0, line  # its cubin's bytes


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_every_cuda_source_compiles_with_nvcc(record):
    result = _run("-m", "harness.compile.compile_cuda")
    record.backend, record.variant = "cuda", "nvcc-sm_90"
    record.add(states_checked=result.stdout.count("\nok ") + result.stdout.startswith("ok "),
               cached=result.stdout.count("(cached: "))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


class FakeNvcc:
    """Stands in for subprocess.run: ``nvcc --version`` and compiles that pass or fail."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.compiles = 0

    def __call__(self, cmd, **kwargs):
        if cmd[:2] == ["nvcc", "--version"]:
            return subprocess.CompletedProcess(cmd, 0, "Cuda compilation tools, release 13.0", "")
        self.compiles += 1
        err = "error: boom" if self.fail else "ptxas info    : Used 28 registers, used 0 barriers"
        return subprocess.CompletedProcess(cmd, 1 if self.fail else 0, "", err)


def _source(tmp_path, text="__global__ void k() {}\n"):
    src = tmp_path / "k.cu"
    src.write_text(text)
    return src


def test_nvcc_cache_key_ignores_venv_paths_and_follows_every_input(tmp_path):
    from harness.compile.compile_cuda import cache_key
    from harness.run import commands

    tool = {"nvcc": "13.0", "torch": "2.13.0", "torch_commit": "abc", "python_headers": "3.11", "shims": {}}

    def key(text="x", dirs=("/venv-a/torch/include", "/py/include"), arch="sm_90", toolchain=tool):
        return cache_key(text, commands.nvcc_command("k.cu", "/tmp/k.o", list(dirs), arch=arch), list(dirs), toolchain)

    assert key() == key(dirs=("/venv-b/torch/include", "/py/include"))
    assert len({key(), key(text="y"), key(arch="sm_80"), key(toolchain={**tool, "nvcc": "12.8"}),
                key(toolchain={**tool, "torch_commit": "def"}), key(dirs=("/one",))}) == 6


def test_an_identical_compile_is_recalled_and_a_changed_source_compiles_again(tmp_path):
    from harness.compile.compile_cuda import compile_one

    src, cache, nvcc = _source(tmp_path), tmp_path / "cache", FakeNvcc()
    first = compile_one(src, "sm_90", ["/inc"], tmp_path, {"nvcc": "13.0"}, cache, run=nvcc)
    again = compile_one(src, "sm_90", ["/other-venv/inc"], tmp_path, {"nvcc": "13.0"}, cache, run=nvcc)
    assert first[0] and again[0] and nvcc.compiles == 1
    assert first[1] == ["ok   sm_90 k.cu", "     ptxas info    : Used 28 registers, used 0 barriers"]
    assert "(cached: the same inputs compiled " in again[1][0] and again[1][1:] == first[1][1:]
    src.write_text("__global__ void k2() {}\n")
    assert compile_one(src, "sm_90", ["/inc"], tmp_path, {"nvcc": "13.0"}, cache, run=nvcc)[0]
    assert nvcc.compiles == 2
    assert compile_one(src, "sm_90", ["/inc"], tmp_path, {"nvcc": "13.0"}, None, run=nvcc)[0]  # no cache
    assert nvcc.compiles == 3


def test_the_toolchain_identity_follows_the_compiler_environment(tmp_path, monkeypatch):
    from harness.compile.compile_cuda import toolchain_identity

    base = {"PATH": "/usr/bin:/bin"}
    same = toolchain_identity({}, run=FakeNvcc(), environ=base)
    assert same == toolchain_identity({}, run=FakeNvcc(), environ={**base, "HOME": "/elsewhere"})
    for name, value in (("NVCC_APPEND_FLAGS", "-include /x.h"), ("NVCC_CCBIN", "/bin/false"),
                        ("CPLUS_INCLUDE_PATH", "/poison"), ("CPATH", "/poison")):
        assert toolchain_identity({}, run=FakeNvcc(), environ={**base, name: value}) != same, name
    assert toolchain_identity({"shim.h": "x"}, run=FakeNvcc(), environ=base) != same


def test_an_unwritable_cache_costs_only_the_recall(tmp_path, capsys):
    from harness.compile.compile_cuda import compile_one

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ok, lines = compile_one(_source(tmp_path), "sm_90", ["/inc"], tmp_path, {}, blocker / "cache", run=FakeNvcc())
    assert ok and lines[0] == "ok   sm_90 k.cu"
    assert "compile cache not written" in capsys.readouterr().err


def test_a_failed_compile_is_never_remembered_and_a_broken_entry_compiles_again(tmp_path):
    from harness.compile.compile_cuda import compile_one

    src, cache = _source(tmp_path), tmp_path / "cache"
    failing = FakeNvcc(fail=True)
    for _ in range(2):
        ok, lines = compile_one(src, "sm_90", ["/inc"], tmp_path, {}, cache, run=failing)
        assert not ok and lines[0] == "FAIL sm_90 k.cu" and "error: boom" in lines[1]
    assert failing.compiles == 2
    assert not list(cache.glob("*.json"))
    nvcc = FakeNvcc()
    compile_one(src, "sm_90", ["/inc"], tmp_path, {}, cache, run=nvcc)
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    ok, lines = compile_one(src, "sm_90", ["/inc"], tmp_path, {}, cache, run=nvcc)
    assert ok and nvcc.compiles == 2 and "cached" not in lines[0]
