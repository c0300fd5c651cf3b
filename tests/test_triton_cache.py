"""harness/compile/triton_cache.py: one compile per Triton specialization across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton.runtime.cache")

KEY = "K" * 52

# Takes the compile lock of KEY on a miss, says "locked", waits for "go" on stdin, waits
# HOLD seconds more, then ends its compile as told: stored, failed with its manager freed, or
# failed with its manager still alive (as a traceback keeps it) until release_all().
HOLDER = textwrap.dedent(f"""
    import sys, time
    from harness.compile import triton_cache
    manager = triton_cache.CompileOnceCacheManager({KEY!r})
    assert manager.get_group("kernel.json") is None and manager.holds_lock  # a miss: this one compiles
    print("locked", flush=True)
    assert sys.stdin.readline().strip() == "go"
    time.sleep(float(sys.argv[1]))
    if sys.argv[2] == "store":
        path = manager.put("{{}}", "kernel.json", binary=False)
        manager.put_group("kernel.json", {{"kernel.json": path}})
    elif sys.argv[2] == "freed":
        del manager
    else:
        assert triton_cache.release_all() == 1 and not manager.holds_lock
    print("done", flush=True)
    time.sleep(30)  # the process lives on: only the three ways above can drop the lock
""")

WAITER = textwrap.dedent(f"""
    import json, time
    from harness.compile import triton_cache
    manager = triton_cache.CompileOnceCacheManager({KEY!r})
    print("waiting", flush=True)
    start = time.monotonic()
    group = manager.get_group("kernel.json")
    print(json.dumps({{"waited_s": time.monotonic() - start, "found": sorted(group or {{}}),
                       "holds_lock": manager.holds_lock, "stats": triton_cache.STATS}}), flush=True)
""")


def _env(cache_dir: Path) -> dict:
    return {**os.environ, "TRITON_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}


def _race(tmp_path, hold_s: float, outcome: str) -> dict:
    """The holder takes the lock; the waiter starts waiting for it; then the holder ends."""
    env = _env(tmp_path / "cache")
    procs = []
    try:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(hold_s), outcome], cwd=ROOT, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(holder)
        assert holder.stdout.readline().strip() == "locked"
        waiter = subprocess.Popen([sys.executable, "-c", WAITER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  text=True)
        procs.append(waiter)
        assert waiter.stdout.readline().strip() == "waiting"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out, _ = waiter.communicate(timeout=120)
        assert waiter.returncode == 0
        return json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_second_process_waits_for_the_compile_and_loads_it(tmp_path):
    seen = _race(tmp_path, hold_s=1.0, outcome="store")
    assert seen["found"] == ["kernel.json"]
    assert seen["waited_s"] >= 0.9  # it waited for the holder instead of compiling too
    assert not seen["holds_lock"]
    assert seen["stats"] == {"stored": 0, "loaded_after_wait": 1}


@pytest.mark.parametrize("outcome", ["freed", "released"])
def test_a_failed_compile_lets_the_waiter_compile(tmp_path, outcome):
    """The holder's compile fails: its manager is freed, or stays alive until release_all()."""
    seen = _race(tmp_path, hold_s=0.5, outcome=outcome)
    assert seen["found"] == []
    assert seen["holds_lock"]  # now this process compiles, while the failed one still runs
    assert 0.4 <= seen["waited_s"] < 20
    assert seen["stats"] == {"stored": 0, "loaded_after_wait": 0}


LEFT_HELD = textwrap.dedent(f"""
    import fcntl, os, subprocess, sys
    from harness.compile import triton_cache

    KEPT = []

    def test_a_compile_fails_and_its_manager_stays_alive():
        manager = triton_cache.CompileOnceCacheManager({KEY!r})
        assert manager.get_group("kernel.json") is None and manager.holds_lock
        KEPT.append(manager)  # as a traceback would keep it

    def test_the_next_test_finds_the_lock_free():
        probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                 "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
        path = os.path.join(KEPT[0].cache_dir, triton_cache.LOCK_FILE)
        assert subprocess.run([sys.executable, "-c", probe, path]).returncode == 0
        assert not KEPT[0].holds_lock
""")


def test_the_plugin_drops_a_failed_compiles_lock_after_its_test(tmp_path):
    (tmp_path / "test_left_held.py").write_text(LEFT_HELD)
    env = {**_env(tmp_path / "cache"), "PYTEST_ADDOPTS": ""}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "-q", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "--results-dir", str(tmp_path / "results"), "test_left_held.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 passed" in out.stdout


COMPILE = textwrap.dedent("""
    import json
    from harness.compile import triton_cache
    from kvbits import aot, packing
    spec = next(s for s in packing.AOT_SPECS)
    aot.compile_spec(spec, 90)
    print(json.dumps(triton_cache.STATS))
""")


@pytest.mark.slow
def test_concurrent_compiles_of_one_kernel_compile_it_once(tmp_path):
    """Two processes compile the same specialization at once into an empty cache: one stores it."""
    pytest.importorskip("triton.backends.nvidia")
    env = {**_env(tmp_path / "cache"), "TRITON_INTERPRET": "0",
           "TRITON_CACHE_MANAGER": "harness.compile.triton_cache:CompileOnceCacheManager"}
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    stats = []
    deadline = time.monotonic() + 600
    for proc in procs:
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        assert proc.returncode == 0, err[-3000:]
        stats.append(json.loads(out.splitlines()[-1]))
    assert sum(s["stored"] for s in stats) == 1, stats
