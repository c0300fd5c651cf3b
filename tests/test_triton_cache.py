"""harness/triton_cache.py: one compile per Triton specialization across processes."""

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

HOLDER = textwrap.dedent("""
    import sys, time
    from harness.triton_cache import CompileOnceCacheManager
    manager = CompileOnceCacheManager("K" * 52)
    assert manager.get_group("kernel.json") is None  # a miss: this process compiles
    print("locked", flush=True)
    time.sleep(float(sys.argv[1]))
    if sys.argv[2] == "store":
        path = manager.put("{}", "kernel.json", binary=False)
        manager.put_group("kernel.json", {"kernel.json": path})
    else:  # the compile failed: the manager is dropped without storing anything
        del manager
    print("done", flush=True)
    time.sleep(float(sys.argv[3]))
""")

WAITER = textwrap.dedent("""
    import json, time
    from harness import triton_cache
    manager = triton_cache.CompileOnceCacheManager("K" * 52)
    start = time.monotonic()
    group = manager.get_group("kernel.json")
    print(json.dumps({"waited_s": time.monotonic() - start, "found": sorted(group or {}),
                      "holds_lock": manager._lock_fd is not None, "stats": triton_cache.STATS}))
""")


def _env(cache_dir: Path) -> dict:
    return {**os.environ, "TRITON_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}


def _race(tmp_path, hold_s: float, outcome: str, linger_s: float = 0.0) -> dict:
    env = _env(tmp_path / "cache")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(hold_s), outcome, str(linger_s)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        waiter = subprocess.run([sys.executable, "-c", WAITER], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=120)
        assert waiter.returncode == 0, waiter.stderr
        return json.loads(waiter.stdout.splitlines()[-1])
    finally:
        holder.kill()
        holder.wait()


def test_a_second_process_waits_for_the_compile_and_loads_it(tmp_path):
    seen = _race(tmp_path, hold_s=1.5, outcome="store")
    assert seen["found"] == ["kernel.json"]
    assert seen["waited_s"] >= 0.5  # it waited for the holder instead of compiling too
    assert not seen["holds_lock"]
    assert seen["stats"] == {"stored": 0, "loaded_after_wait": 1}


def test_a_failed_compile_lets_the_waiter_compile(tmp_path):
    seen = _race(tmp_path, hold_s=0.5, outcome="fail", linger_s=30)
    assert seen["found"] == []
    assert seen["holds_lock"]  # now this process compiles, while the failed one still runs
    assert seen["waited_s"] < 20


COMPILE = textwrap.dedent("""
    import json
    from harness import triton_cache
    from kernels import aot, packing
    spec = next(s for s in packing.AOT_SPECS)
    aot.compile_spec(spec, 90)
    print(json.dumps(triton_cache.STATS))
""")


@pytest.mark.slow
def test_concurrent_compiles_of_one_kernel_compile_it_once(tmp_path):
    """Two processes compile the same specialization at once into an empty cache: one stores it."""
    pytest.importorskip("triton.backends.nvidia")
    env = {**_env(tmp_path / "cache"), "TRITON_INTERPRET": "0",
           "TRITON_CACHE_MANAGER": "harness.triton_cache:CompileOnceCacheManager"}
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    stats = []
    deadline = time.monotonic() + 600
    for proc in procs:
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        assert proc.returncode == 0, err[-3000:]
        stats.append(json.loads(out.splitlines()[-1]))
    assert sum(s["stored"] for s in stats) == 1, stats
