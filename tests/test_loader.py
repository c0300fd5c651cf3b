"""The CUDA/C++ extension loader: names, build directories, and locks left by killed builds."""

from __future__ import annotations

from kvbits.cuda import loader


def test_extension_name_follows_the_source_and_flags():
    a = loader.extension_name("pack3", "src", ["-O3"])
    assert a == loader.extension_name("pack3", "src", ["-O3"])
    assert a != loader.extension_name("pack3", "src2", ["-O3"])
    assert a != loader.extension_name("pack3", "src", ["-O2"])
    assert a.startswith("kvh_pack3_")


def test_build_dirs_are_per_device_set_and_shared_by_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("KVH_EXT_DIR", str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    first = loader.build_dir_for("ext")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw4")
    assert loader.build_dir_for("ext") == first  # same GPU: one build, taken in turns under the lock
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    other = loader.build_dir_for("ext")
    assert other != first and first.is_dir() and other.is_dir()
    assert first.parent == other.parent == tmp_path / "ext"


def test_the_build_lock_serializes_processes(tmp_path):
    """A second process waits on the lock while the first holds it (what a build in progress does)."""
    import subprocess
    import sys
    import time

    holder = (
        "import sys, time; from pathlib import Path; from kvbits.cuda import loader\n"
        "with loader._exclusive(Path(sys.argv[1])):\n"
        "    print('held', flush=True); time.sleep(1.0)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    start = time.perf_counter()
    with loader._exclusive(tmp_path):
        waited = time.perf_counter() - start
    first.wait(timeout=30)
    assert waited > 0.5


def test_a_lock_left_by_a_killed_build_does_not_block_the_next(tmp_path):
    stale = tmp_path / "lock"  # what torch's FileBaton leaves when its process is killed mid-build
    stale.write_text("")
    with loader._exclusive(tmp_path):
        assert not stale.exists()


def test_source_text_builds_are_named_after_their_stem(monkeypatch):
    """Experiments (scripts/) hand the loader CUDA text instead of a file; without a CUDA device
    the refusal names the experiment."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    with pytest.raises(RuntimeError, match=r"sweep_experiment \(source text\) needs a CUDA device"):
        loader.load_extension("sweep_experiment", functions=["f"], declarations="void f();",
                              source_text="void f() {}")


def test_a_killed_builds_compiler_processes_are_waited_out(tmp_path):
    """A process still working in the build directory (the ninja of a killed worker) holds the
    next build back; once it ends, the stale lock goes and the build proceeds."""
    import subprocess
    import time

    assert loader.processes_working_in(tmp_path) == []
    orphan = subprocess.Popen(["sleep", "1.5"], cwd=tmp_path)
    try:
        assert orphan.pid in loader.processes_working_in(tmp_path)
        (tmp_path / "lock").write_text("")
        start = time.perf_counter()
        with loader._exclusive(tmp_path, wait_s=30):
            waited = time.perf_counter() - start
            assert not (tmp_path / "lock").exists()
        assert waited > 0.5 and orphan.poll() is not None
    finally:
        orphan.kill()
        orphan.wait()
