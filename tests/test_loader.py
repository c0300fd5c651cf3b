"""The CUDA/C++ extension loader: names, build directories, and locks left by killed builds."""

from __future__ import annotations

from kernels.cuda import loader


def test_extension_name_follows_the_source_and_flags():
    a = loader.extension_name("pack3", "src", ["-O3"])
    assert a == loader.extension_name("pack3", "src", ["-O3"])
    assert a != loader.extension_name("pack3", "src2", ["-O3"])
    assert a != loader.extension_name("pack3", "src", ["-O2"])
    assert a.startswith("kvh_pack3_")


def test_build_dirs_are_per_worker_and_device_set(tmp_path, monkeypatch):
    monkeypatch.setenv("KVH_EXT_DIR", str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    first = loader.build_dir_for("ext")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw4")
    second = loader.build_dir_for("ext")
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent == second.parent == tmp_path / "ext"


def test_a_lock_left_by_a_killed_build_does_not_block_the_next(tmp_path):
    stale = tmp_path / "lock"  # what torch's FileBaton leaves when its process is killed mid-build
    stale.write_text("")
    with loader._exclusive(tmp_path):
        assert not stale.exists()
